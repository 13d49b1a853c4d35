#include "core/device_map.h"

#include <algorithm>

#include "base/text.h"

namespace cuda_criu {
namespace {

bool is_index(const std::string &s)
{
	return !s.empty() && s.size() < 4 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<GpuRef> parse_ref(const std::string &text)
{
	GpuRef ref;
	if (is_index(text)) {
		ref.index = std::stoi(text);
		return ref;
	}
	auto uuid = GpuUuid::parse(text);
	if (!uuid)
		return std::move(uuid).error();
	ref.uuid = *uuid;
	return ref;
}

} // namespace

std::string GpuRef::str() const { return uuid ? uuid->str() : std::to_string(index); }

std::string DeviceMap::str() const
{
	std::string out;
	for (const Entry &e : entries)
		out += (out.empty() ? "" : ",") + e.from.str() + "=" + e.to.str();
	return out;
}

Result<DeviceMap> DeviceMap::parse(const std::string &text)
{
	DeviceMap map;
	size_t pos = 0;
	while (pos < text.size()) {
		size_t comma = std::min(text.find(',', pos), text.size());
		std::string item = text.substr(pos, comma - pos);
		pos = comma + 1;
		if (item.empty())
			continue;
		size_t eq = item.find('=');
		if (eq == std::string::npos)
			return make_error(EINVAL, "device map '%s': '%s' is not OLD=NEW", printable(text).c_str(),
					  printable(item).c_str());
		auto from = parse_ref(item.substr(0, eq));
		if (!from)
			return std::move(from).error().context("device map '%s'", printable(text).c_str());
		auto to = parse_ref(item.substr(eq + 1));
		if (!to)
			return std::move(to).error().context("device map '%s'", printable(text).c_str());
		for (const Entry &e : map.entries)
			if (e.from.str() == from->str())
				return make_error(EINVAL, "device map '%s': %s is mapped twice", printable(text).c_str(),
						  from->str().c_str());
		map.entries.push_back({*from, *to});
	}
	return map;
}

} // namespace cuda_criu
