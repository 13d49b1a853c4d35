#include "os/thp.h"

#include <cstdlib>
#include <sstream>

#include "base/text.h"

namespace cuda_criu {
namespace {

// A sysfs file's selected word, with the file named in the error.
Result<std::string> read_choice(const std::string &path)
{
	auto text = read_small_file(path, 4096);
	if (!text)
		return std::move(text).error();
	auto choice = parse_thp_choice(*text);
	if (!choice)
		return std::move(choice).error().context("%s", path.c_str());
	return choice;
}

} // namespace

Result<std::string> parse_thp_choice(std::string_view text)
{
	while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\t'))
		text.remove_suffix(1); // the file's newline, left out of the messages
	std::string choice;
	bool found = false;
	std::istringstream words{std::string(text)};
	std::string word;
	while (words >> word) {
		const bool opens = word.front() == '[', closes = word.back() == ']';
		if (!opens && !closes && word.find_first_of("[]") == std::string::npos)
			continue;
		if (!opens || !closes || word.size() < 3 || word.find_first_of("[]", 1) != word.size() - 1)
			return make_error(EINVAL, "malformed word '%s' in '%s'", printable(word).c_str(),
					  printable(text).c_str());
		if (found)
			return make_error(EINVAL, "more than one word in brackets in '%s'", printable(text).c_str());
		choice = word.substr(1, word.size() - 2);
		found = true;
	}
	if (!found)
		return make_error(EINVAL, "no word in brackets in '%s'", printable(text).c_str());
	return choice;
}

Result<ThpSettings> read_thp_settings(const std::string &dir)
{
	ThpSettings s;
	auto enabled = read_choice(dir + "/enabled");
	if (!enabled)
		return std::move(enabled).error();
	s.enabled = std::move(*enabled);
	if (auto defrag = read_choice(dir + "/defrag"))
		s.defrag = std::move(*defrag);
	s.pmd_mode = s.enabled;
	// hpage_pmd_size names the per-size directory: 2097152 -> hugepages-2048kB.
	auto pmd_size = read_small_file(dir + "/hpage_pmd_size", 64);
	const unsigned long bytes = pmd_size ? std::strtoul(pmd_size->c_str(), nullptr, 10) : 0;
	if (bytes >= 1024) {
		std::string file = format("%s/hugepages-%lukB/enabled", dir.c_str(), bytes / 1024);
		if (auto mode = read_choice(file)) {
			s.pmd_size_file = std::move(file);
			s.pmd_size_mode = std::move(*mode);
			if (s.pmd_size_mode != "inherit")
				s.pmd_mode = s.pmd_size_mode;
		}
	}
	return s;
}

ThpCounters parse_thp_counters(std::string_view vmstat)
{
	ThpCounters c;
	std::istringstream lines{std::string(vmstat)};
	std::string key;
	uint64_t value = 0;
	while (lines >> key >> value) {
		if (key == "thp_fault_alloc")
			c.faults = value;
		else if (key == "thp_fault_fallback")
			c.fallbacks = value;
		else if (key == "compact_stall")
			c.compact_stalls = value;
	}
	return c;
}

ThpCounters read_thp_counters()
{
	auto text = read_small_file("/proc/vmstat", 64 << 10);
	return text ? parse_thp_counters(*text) : ThpCounters{};
}

} // namespace cuda_criu
