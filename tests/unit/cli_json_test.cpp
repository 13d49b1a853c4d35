// The bytes of the CLI's --json output: its layout, numbers and escaping, and what becomes of text that is
// not valid UTF-8 (a process's command line, a path, a name read from an image).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "json.h"

namespace cuda_criu::cli {
namespace {

// A one-key document, for the value's text alone.
std::string text_of(const Json &value) { return json_text(Json{{"v", value}}); }

TEST(JsonText, IndentsTwoSpacesAndKeepsTheKeysInOrder)
{
	Json j = {{"name", "gpu"},
		  {"empty_object", Json::object()},
		  {"empty_array", Json::array()},
		  {"list", Json::array({1, "two", nullptr, true, false})},
		  {"nested", Json{{"z", Json::array({Json::object(), Json::array({3})})}, {"a", -4}}}};
	EXPECT_EQ(json_text(j), "{\n"
				"  \"name\": \"gpu\",\n"
				"  \"empty_object\": {},\n"
				"  \"empty_array\": [],\n"
				"  \"list\": [\n"
				"    1,\n"
				"    \"two\",\n"
				"    null,\n"
				"    true,\n"
				"    false\n"
				"  ],\n"
				"  \"nested\": {\n"
				"    \"z\": [\n"
				"      {},\n"
				"      [\n"
				"        3\n"
				"      ]\n"
				"    ],\n"
				"    \"a\": -4\n"
				"  }\n"
				"}\n");
	EXPECT_EQ(json_text(Json::object()), "{}\n");
}

TEST(JsonText, WritesIntegersWhole)
{
	EXPECT_EQ(text_of(std::numeric_limits<int64_t>::min()), "{\n  \"v\": -9223372036854775808\n}\n");
	EXPECT_EQ(text_of(std::numeric_limits<uint64_t>::max()), "{\n  \"v\": 18446744073709551615\n}\n");
	EXPECT_EQ(text_of(0U), "{\n  \"v\": 0\n}\n");
}

TEST(JsonText, WritesDoublesAsPrintfG)
{
	const std::pair<double, const char *> cases[] = {
		{0.0, "0"},
		{3.0, "3"},
		{-2.5, "-2.5"},
		{1.0 / 3, "0.333333"},
		{123456.0, "123456"},
		{1234567.0, "1.23457e+06"},
		{0.0001, "0.0001"},
		{0.00001234, "1.234e-05"},
		{std::numeric_limits<double>::quiet_NaN(), "null"},
		{std::numeric_limits<double>::infinity(), "null"},
		{-std::numeric_limits<double>::infinity(), "null"},
	};
	for (const auto &[d, want] : cases)
		EXPECT_EQ(text_of(d), std::string("{\n  \"v\": ") + want + "\n}\n") << d;
}

TEST(JsonText, EscapesQuotesBackslashesAndControlCharactersOnly)
{
	// Keys are escaped like values; '/', DEL and valid UTF-8 are written as they are.
	Json j = {{"k\"\n", "q\" b\\ s/ \b\f\n\r\t \x01\x1f \x7f \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"}};
	EXPECT_EQ(json_text(j), "{\n  \"k\\\"\\n\": \"q\\\" b\\\\ s/ \\b\\f\\n\\r\\t \\u0001\\u001f \x7f \xc3\xa9 "
				"\xe2\x82\xac \xf0\x9f\x98\x80\"\n}\n");
}

TEST(JsonText, ReplacesBytesThatAreNotUtf8)
{
	const std::string fffd = "\xef\xbf\xbd"; // U+FFFD, as UTF-8
	const std::pair<std::string, std::string> cases[] = {
		{"a\xff" "b", "a" + fffd + "b"},
		{"\x80", fffd},
		{"\xc0\x80", fffd + fffd},                   // overlong NUL
		{"\xed\xa0\x80", fffd + fffd + fffd},        // a UTF-16 surrogate
		{"\xf4\x90\x80\x80", fffd + fffd + fffd + fffd}, // past U+10FFFF
		{"\xe2\x82" "A", fffd + "A"},                // a sequence cut short: one U+FFFD
		{"x\xf0\x9f\x98", "x" + fffd},               // ... at the end
		{"\xef\xbf\xbd", fffd},                      // a U+FFFD of the input
	};
	for (const auto &[in, want] : cases) {
		std::string out = text_of(in);
		EXPECT_EQ(out, "{\n  \"v\": \"" + want + "\"\n}\n") << testing::PrintToString(in);
		EXPECT_EQ(Json::parse(out)["v"], want) << out; // it parses
	}
}

} // namespace
} // namespace cuda_criu::cli
