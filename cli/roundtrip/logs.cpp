#include "roundtrip/logs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>

namespace cuda_criu::cli::roundtrip {
namespace {

constexpr size_t kMaxLineBytes = 500;
constexpr std::streamoff kMaxLogTail = 8 << 20; // of a CRIU log, only the end is read for an excerpt

struct HintRule {
	const char *needle;
	const char *hint;
};

const HintRule kHints[] = {
	{"Connected TCP socket",
	 "the program holds an established TCP connection, which CRIU does not checkpoint by default: close it "
	 "before the checkpoint, or pass --criu-arg --tcp-established (the peer must then live with the "
	 "connection being frozen and restored)"},
	{"In-flight connection", "a listening socket has connections not yet accepted: --criu-arg --skip-in-flight "
				 "drops them"},
	{"External socket is used", "the program is connected to a unix socket outside its process tree: "
				    "--criu-arg --ext-unix-sk lets CRIU dump it"},
	{"error while loading shared libraries",
	 "criu cannot find its shared libraries: give their directory with --criu-env LD_LIBRARY_PATH=DIR"},
	{"has bad size", "a file the program had open changed between the dump and the restore; CRIU restores "
			 "only onto the same file (open logs with O_APPEND, write state files in place)"},
	{"cuda_plugin: ", "the lines of cuda_plugin say what the GPU side did; 'cuda-criu check' checks the "
			  "driver, CRIU and the plugin"},
};

// The prefixes of plugin/base/log.cpp.
constexpr std::string_view kPluginPrefixes[] = {"cuda_plugin: ", "Error (cuda_plugin): ", "Warn  (cuda_plugin): "};

// Passes over s's leading characters in set, at least min of them; false when fewer are there.
bool skip_chars(std::string_view &s, std::string_view set, size_t min)
{
	size_t n = 0;
	while (n < s.size() && set.find(s[n]) != std::string_view::npos)
		n++;
	s.remove_prefix(n);
	return n >= min;
}

bool skip_literal(std::string_view &s, std::string_view literal)
{
	if (s.substr(0, literal.size()) != literal)
		return false;
	s.remove_prefix(literal.size());
	return true;
}

// CRIU's prefixes of a log line (criu/log.c): "(SS.UUUUUU) " at -v4, then "%6d: " in a restored task.
std::string_view without_criu_prefixes(std::string_view line)
{
	std::string_view s = line;
	if (skip_literal(s, "(") && skip_chars(s, "0123456789", 1) && skip_literal(s, ".") &&
	    skip_chars(s, "0123456789", 1) && skip_literal(s, ") "))
		line = s;
	s = line;
	skip_chars(s, " ", 0);
	if (skip_chars(s, "0123456789", 1) && skip_literal(s, ": "))
		line = s;
	return line;
}

// Length of the valid UTF-8 sequence at s[i]; 0 when there is none (invalid, overlong, truncated).
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

} // namespace

std::string clean_line(std::string_view s)
{
	std::string out;
	for (size_t i = 0; i < s.size() && out.size() < kMaxLineBytes;) {
		auto c = static_cast<unsigned char>(s[i]);
		if (c == '\t' || (c >= 0x20 && c != 0x7f && c < 0x80)) {
			out += static_cast<char>(c);
			i++;
		} else if (size_t len = c >= 0x80 ? utf8_sequence_length(s, i) : 0; len > 1) {
			out.append(s.substr(i, len));
			i += len;
		} else {
			out += '?';
			i++;
		}
	}
	if (out.size() >= kMaxLineBytes)
		out += "...";
	return out;
}

std::vector<std::string> read_lines(const std::string &path)
{
	std::vector<std::string> lines;
	std::ifstream f(path, std::ios::binary);
	if (!f)
		return lines;
	f.seekg(0, std::ios::end);
	std::streamoff size = f.tellg();
	bool cut = size > kMaxLogTail;
	f.seekg(cut ? size - kMaxLogTail : 0);
	std::string line;
	while (std::getline(f, line)) {
		if (cut) {
			cut = false;
			continue;
		}
		if (!line.empty() && line.back() == '\r')
			line.pop_back();
		lines.push_back(clean_line(line));
	}
	return lines;
}

LogBlock tail_of(const std::string &path, size_t n)
{
	std::vector<std::string> all = read_lines(path);
	size_t from = all.size() > n ? all.size() - n : 0;
	return {path, std::vector<std::string>(all.begin() + static_cast<long>(from), all.end())};
}

LogBlock criu_log_excerpt(const std::string &path)
{
	std::vector<std::string> all = read_lines(path);
	std::vector<size_t> errors, plugin;
	for (size_t i = 0; i < all.size(); i++) {
		if (all[i].find("Error") != std::string::npos)
			errors.push_back(i);
		else if (plugin_message(all[i]))
			plugin.push_back(i);
	}
	if (errors.empty() && plugin.empty())
		return tail_of(path);
	if (errors.size() > kExplainLines)
		errors.erase(errors.begin(), errors.end() - static_cast<long>(kExplainLines));
	size_t room = kExplainLines - errors.size();
	if (plugin.size() > room)
		plugin.erase(plugin.begin(), plugin.end() - static_cast<long>(room));
	std::vector<size_t> keep = errors;
	keep.insert(keep.end(), plugin.begin(), plugin.end());
	std::sort(keep.begin(), keep.end());
	LogBlock b{path, {}};
	for (size_t i : keep)
		b.lines.push_back(all[i]);
	return b;
}

std::string hint_for(const std::vector<LogBlock> &logs)
{
	for (const HintRule &rule : kHints)
		for (const LogBlock &b : logs)
			for (const std::string &line : b.lines)
				if (line.find(rule.needle) != std::string::npos)
					return rule.hint;
	return {};
}

std::optional<std::string_view> plugin_message(std::string_view line)
{
	std::string_view s = without_criu_prefixes(line);
	for (std::string_view prefix : kPluginPrefixes)
		if (skip_literal(s, prefix))
			return s;
	return std::nullopt;
}

bool is_progress_message(std::string_view msg)
{
	constexpr std::string_view kDone = " process(es) done";
	bool phase = msg.substr(0, 12) == "checkpoint: " || msg.substr(0, 9) == "restore: ";
	return phase && msg.size() > kDone.size() && msg.substr(msg.size() - kDone.size()) == kDone;
}

std::vector<std::string> LogFollower::new_lines()
{
	std::vector<std::string> out;
	int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return out;
	struct stat st = {};
	if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < offset_) {
		offset_ = 0;
		partial_.clear();
	}
	// At most 16 MiB a look: a verbose log of a large dump grows fast, and the next look goes on.
	char buf[64 * 1024];
	for (int i = 0; i < 256; i++) {
		ssize_t n = pread(fd, buf, sizeof buf, static_cast<off_t>(offset_));
		if (n <= 0)
			break;
		offset_ += static_cast<uint64_t>(n);
		partial_.append(buf, static_cast<size_t>(n));
	}
	::close(fd);
	size_t start = 0;
	for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
		out.push_back(partial_.substr(start, nl - start));
	partial_.erase(0, start);
	return out;
}

int restored_cuda_processes(const std::vector<std::string> &log_lines)
{
	int found = -1;
	size_t lines = 0;
	for (const std::string &l : log_lines) {
		auto msg = plugin_message(l);
		if (!msg || msg->substr(0, 9) != "restore: ")
			continue;
		// The whole of plugin/core/session.cpp's format up to "failed, ", nothing else.
		std::string text(*msg);
		unsigned n = 0, failed = 0;
		int end = 0;
		if (std::sscanf(text.c_str(), "restore: %u CUDA process(es), %u failed, %n", &n, &failed, &end) == 2 &&
		    end > 0 && std::isdigit(static_cast<unsigned char>(text[9]))) {
			found = static_cast<int>(n);
			lines++;
		}
	}
	// A restore has one summary line: a second one, whatever its numbers, makes the count unknown.
	return lines == 1 ? found : -1;
}

} // namespace cuda_criu::cli::roundtrip
