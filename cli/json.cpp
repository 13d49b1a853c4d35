#include "json.h"

#include <cmath>
#include <cstdio>

namespace cuda_criu::cli {
namespace {

std::string dump(const Json &v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

// dump(2)'s layout, written here only because dump() has no way to format a double.
void write(std::string &out, const Json &v, size_t depth)
{
	if (v.is_number_float()) {
		double d = v.get<double>();
		char buf[32] = "null";
		if (std::isfinite(d))
			std::snprintf(buf, sizeof(buf), "%.6g", d);
		out += buf;
		return;
	}
	if (!v.is_structured() || v.empty()) {
		out += dump(v);
		return;
	}
	out += v.is_object() ? '{' : '[';
	for (auto it = v.begin(); it != v.end(); ++it) {
		out += it == v.begin() ? "\n" : ",\n";
		out.append(2 * (depth + 1), ' ');
		if (v.is_object())
			out += dump(it.key()) + ": ";
		write(out, *it, depth + 1);
	}
	out += '\n';
	out.append(2 * depth, ' ');
	out += v.is_object() ? '}' : ']';
}

} // namespace

std::string json_text(const Json &v)
{
	std::string out;
	write(out, v, 0);
	return out + '\n';
}

} // namespace cuda_criu::cli
