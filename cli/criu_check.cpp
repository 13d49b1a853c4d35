#include "criu_check.h"

#include <sys/stat.h>

#include "base/format.h"
#include "elf_file.h"
#include "os/dir.h"

namespace cuda_criu::cli {
namespace {

enum class PluginFile { Missing, Unreadable, Ours, CriusOwn };

// What file (DIR/cuda_plugin.so) is; error: why it could not be read (Missing, Unreadable).
PluginFile classify_plugin(const std::string &file, std::string &error)
{
	auto ours = file_contains(file, kPluginMarker);
	if (!ours) {
		error = ours.error().message();
		struct stat st = {};
		return stat(file.c_str(), &st) != 0 && errno == ENOENT ? PluginFile::Missing : PluginFile::Unreadable;
	}
	return *ours ? PluginFile::Ours : PluginFile::CriusOwn;
}

// The other .so files in dir that register as cuda_plugin (CRIU's own under another file name): CRIU
// loads every .so there, and such a one takes the CUDA processes before ours or fails the restore's
// inventory check.
std::string other_cuda_plugins(const std::string &dir)
{
	std::string others;
	auto d = Dir::open(dir);
	if (!d)
		return others;
	while (const char *e = d->next()) {
		std::string name = e;
		if (name == kPluginFileName || name.size() < 4 || name.compare(name.size() - 3, 3, ".so") != 0)
			continue;
		auto has = file_contains(format("%s/%s", dir.c_str(), e), "cuda_plugin");
		if (has && *has) {
			others += others.empty() ? "" : ", ";
			others += name;
		}
	}
	return others;
}

} // namespace

const char *level_name(Level l) { return l == Level::Ok ? "ok" : l == Level::Warn ? "warn" : "fail"; }

Level Checks::worst() const
{
	Level w = Level::Ok;
	for (const CheckLine &l : lines_)
		if (static_cast<int>(l.level) > static_cast<int>(w))
			w = l.level;
	return w;
}

const CheckLine *Checks::first(Level level) const
{
	for (const CheckLine &l : lines_)
		if (static_cast<int>(l.level) >= static_cast<int>(level))
			return &l;
	return nullptr;
}

CriuFacts check_criu(Checks &c, const Result<CriuLocation> &loc, const std::vector<std::string> &env)
{
	CriuFacts facts;
	if (!loc) {
		c.add("criu", Level::Fail, loc.error().message(),
		      "install CRIU 4.0 or newer (scripts/build-criu.sh builds one with this project's patch), or pass "
		      "--criu PATH");
		return facts;
	}
	facts.location = *loc;
	if (loc->only_in_path) {
		c.add("criu", Level::Warn, loc->path + ": found only through $PATH, so not run",
		      "pass --criu " + loc->path + " to check it (a program found only through $PATH is never run)");
	} else if (auto v = criu_version(loc->path, env); !v) {
		c.add("criu", Level::Fail, v.error().message(), "is " + loc->path + " a working CRIU?");
	} else {
		facts.version = *v;
		c.add("criu", Level::Ok, format("%s: CRIU %s", loc->path.c_str(), v->text.c_str()));
		if (has_device_hooks(*v))
			c.add("criu-device-hooks", Level::Ok,
			      format("CRIU %s has the PAUSE_DEVICES, CHECKPOINT_DEVICES and RESUME_DEVICES_LATE hooks",
				     v->text.c_str()));
		else
			c.add("criu-device-hooks", Level::Fail,
			      format("CRIU %s predates 4.0: it has none of the device hooks the plugin needs", v->text.c_str()),
			      "install CRIU 4.0 or newer");
	}
	auto patched = elf_defines_dynamic_symbol(loc->path, kCriuPatchSymbol);
	if (!patched) {
		c.add("criu-patch", Level::Warn, patched.error().message());
		return facts;
	}
	facts.patched = *patched;
	if (*patched)
		c.add("criu-patch", Level::Ok, format("%s: a failed GPU restore fails the restore", kCriuPatchSymbol));
	else
		c.add("criu-patch", Level::Warn,
		      format("stock CRIU (no %s): it ignores a failing RESUME_DEVICES_LATE hook, so the plugin itself kills "
			     "a process whose GPU state it could not restore rather than let it run without",
			     kCriuPatchSymbol),
		      "for restores that fail cleanly, build CRIU with criu-patches/ (scripts/build-criu.sh)");
	return facts;
}

CheckLine check_plugin(const Libdir &libdir, const std::string &how_else)
{
	const std::string file = libdir.dir + "/" + kPluginFileName;
	const std::string source = " (" + libdir.source + ")";
	const std::string install = format("install cuda_plugin.so into %s ('cmake --install BUILD' puts it into "
					   "/usr/lib/criu; the file is BUILD/plugin/cuda_plugin.so), or %s",
					   libdir.dir.c_str(), how_else.c_str());
	std::string error;
	switch (classify_plugin(file, error)) {
	case PluginFile::Missing:
		return {"plugin", Level::Fail, "no cuda_plugin.so in " + libdir.dir + source, install};
	case PluginFile::Unreadable:
		return {"plugin", Level::Fail, error, "make " + file + " a readable file"};
	case PluginFile::CriusOwn:
		return {"plugin", Level::Fail,
			file + " is CRIU's own CUDA plugin (it runs cuda-checkpoint), not cuda-criu's" + source,
			"replace it with cuda-criu's plugin (same file name), or " + how_else};
	case PluginFile::Ours:
		break;
	}
	if (std::string others = other_cuda_plugins(libdir.dir); !others.empty())
		return {"plugin", Level::Fail, format("%s in %s also registers as cuda_plugin", others.c_str(), (libdir.dir + source).c_str()),
			"remove " + others + " from " + libdir.dir + " (CRIU loads every .so there)"};
	return {"plugin", Level::Ok, "criu loads " + file + source, ""};
}

Preflight preflight_criu_and_plugin(const std::string &criu_option, const std::string &libdir,
				    const std::vector<std::string> &criu_env)
{
	Checks c;
	CriuFacts facts = check_criu(c, find_criu(criu_option), criu_env);
	c.add(check_plugin({libdir, "criu -L"}, "give its directory with --libdir"));
	Preflight p;
	// A criu found only through $PATH is not run; a stock CRIU (criu-patch) is fine.
	for (const CheckLine &l : c.lines())
		if (l.level == Level::Fail || (l.level == Level::Warn && l.name == "criu")) {
			p.message = l.detail;
			p.hint = l.hint;
			return p;
		}
	p.ok = true;
	p.criu = facts.location->path;
	p.version = *facts.version;
	p.plugin = libdir + "/" + kPluginFileName;
	return p;
}

} // namespace cuda_criu::cli
