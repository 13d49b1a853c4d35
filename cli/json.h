// A small JSON writer for the --json output of the commands: objects, arrays, strings, numbers, booleans
// and null, indented two spaces. Strings are escaped per RFC 8259; bytes that are not valid UTF-8 (a
// process's command line may hold any bytes) become U+FFFD so that the output always parses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_criu::cli {

class JsonWriter {
public:
	JsonWriter &begin_object() { return open('{'); }
	JsonWriter &end_object() { return close('}'); }
	JsonWriter &begin_array() { return open('['); }
	JsonWriter &end_array() { return close(']'); }
	// The key of the next value inside an object.
	JsonWriter &key(std::string_view name);

	JsonWriter &value(std::string_view s);
	JsonWriter &value(const char *s) { return value(std::string_view(s)); }
	JsonWriter &value(const std::string &s) { return value(std::string_view(s)); }
	JsonWriter &value(int64_t n);
	JsonWriter &value(uint64_t n);
	JsonWriter &value(int n) { return value(static_cast<int64_t>(n)); }
	JsonWriter &value(unsigned n) { return value(static_cast<uint64_t>(n)); }
	JsonWriter &value(double d);
	JsonWriter &value(bool b);
	JsonWriter &null();

	// key + value in one call.
	template <typename T>
	JsonWriter &field(std::string_view name, const T &v)
	{
		return key(name).value(v);
	}

	// The document so far, ending in a newline once the outermost value is closed.
	const std::string &str() const { return out_; }

private:
	void before_value();
	JsonWriter &open(char c);
	JsonWriter &close(char c);
	void newline();

	std::string out_;
	std::vector<bool> has_items_; // one per open container
	bool after_key_ = false;
};

// s as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

// Length of the valid UTF-8 sequence at s[i]; 0 when there is none (invalid, overlong, truncated).
size_t utf8_sequence_length(std::string_view s, size_t i);

} // namespace cuda_criu::cli
