#include "json.h"

#include <cmath>
#include <cstdio>

namespace cuda_criu::cli {

size_t utf8_sequence_length(std::string_view s, size_t i)
{
	auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
	unsigned char c = byte(i);
	size_t len;
	uint32_t cp;
	if (c < 0x80)
		return 1;
	if ((c & 0xe0) == 0xc0) {
		len = 2;
		cp = c & 0x1f;
	} else if ((c & 0xf0) == 0xe0) {
		len = 3;
		cp = c & 0x0f;
	} else if ((c & 0xf8) == 0xf0) {
		len = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (i + len > s.size())
		return 0;
	for (size_t k = 1; k < len; k++) {
		if ((byte(i + k) & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (byte(i + k) & 0x3f);
	}
	// Overlong forms, UTF-16 surrogates and values past U+10FFFF are not valid UTF-8.
	static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
	if (cp < kMin[len] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

std::string json_quote(std::string_view s)
{
	std::string out;
	out.reserve(s.size() + 2);
	out += '"';
	for (size_t i = 0; i < s.size();) {
		unsigned char c = static_cast<unsigned char>(s[i]);
		switch (c) {
		case '"':
			out += "\\\"";
			break;
		case '\\':
			out += "\\\\";
			break;
		case '\n':
			out += "\\n";
			break;
		case '\r':
			out += "\\r";
			break;
		case '\t':
			out += "\\t";
			break;
		case '\b':
			out += "\\b";
			break;
		case '\f':
			out += "\\f";
			break;
		default:
			if (c < 0x20) {
				char buf[8];
				std::snprintf(buf, sizeof(buf), "\\u%04x", c);
				out += buf;
			} else if (c >= 0x80) {
				size_t len = utf8_sequence_length(s, i);
				if (len == 0) {
					out += "\\ufffd";
					i++;
				} else {
					out.append(s.substr(i, len));
					i += len;
				}
				continue;
			} else {
				out += static_cast<char>(c);
			}
		}
		i++;
	}
	out += '"';
	return out;
}

void JsonWriter::newline()
{
	out_ += '\n';
	out_.append(2 * has_items_.size(), ' ');
}

void JsonWriter::before_value()
{
	if (after_key_) {
		after_key_ = false;
		return;
	}
	if (!has_items_.empty()) {
		if (has_items_.back())
			out_ += ',';
		has_items_.back() = true;
		newline();
	}
}

JsonWriter &JsonWriter::open(char c)
{
	before_value();
	out_ += c;
	has_items_.push_back(false);
	return *this;
}

JsonWriter &JsonWriter::close(char c)
{
	bool had_items = has_items_.back();
	has_items_.pop_back();
	if (had_items)
		newline();
	out_ += c;
	if (has_items_.empty())
		out_ += '\n';
	return *this;
}

JsonWriter &JsonWriter::key(std::string_view name)
{
	before_value();
	out_ += json_quote(name);
	out_ += ": ";
	after_key_ = true;
	return *this;
}

JsonWriter &JsonWriter::value(std::string_view s)
{
	before_value();
	out_ += json_quote(s);
	return *this;
}

JsonWriter &JsonWriter::value(int64_t n)
{
	before_value();
	out_ += std::to_string(n);
	return *this;
}

JsonWriter &JsonWriter::value(uint64_t n)
{
	before_value();
	out_ += std::to_string(n);
	return *this;
}

JsonWriter &JsonWriter::value(double d)
{
	before_value();
	if (!std::isfinite(d)) { // JSON has no NaN or infinity
		out_ += "null";
		return *this;
	}
	char buf[64];
	std::snprintf(buf, sizeof(buf), "%.6g", d);
	out_ += buf;
	return *this;
}

JsonWriter &JsonWriter::value(bool b)
{
	before_value();
	out_ += b ? "true" : "false";
	return *this;
}

JsonWriter &JsonWriter::null()
{
	before_value();
	out_ += "null";
	return *this;
}

} // namespace cuda_criu::cli
