#include "preflight.h"

#include <sys/stat.h>

#include "elf_file.h"

namespace cuda_criu::cli {
namespace {

Preflight refused(std::string message, std::string hint = {})
{
	Preflight p;
	p.message = std::move(message);
	p.hint = std::move(hint);
	return p;
}

} // namespace

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

Preflight preflight_criu_and_plugin(const std::string &criu_option, const std::string &libdir,
				    const std::vector<std::string> &criu_env)
{
	auto loc = find_criu(criu_option);
	if (!loc)
		return refused(loc.error().message(), "install CRIU 4.0 or newer, or pass --criu PATH");
	if (loc->only_in_path)
		return refused("criu found only through $PATH at " + loc->path, "pass --criu " + loc->path + " to use it");
	auto version = criu_version(loc->path, criu_env);
	if (!version)
		return refused(version.error().message(), "is " + loc->path + " a working CRIU?");
	if (!has_device_hooks(*version))
		return refused("CRIU " + version->text + " predates 4.0 (no device hooks)", "install CRIU 4.0 or newer");
	std::string plugin = libdir + "/" + kPluginFileName;
	std::string error;
	switch (classify_plugin(plugin, error)) {
	case PluginFile::Missing:
	case PluginFile::Unreadable:
		return refused("plugin: " + error,
			       "give the directory holding cuda_plugin.so with --libdir, or install it into /usr/lib/criu");
	case PluginFile::CriusOwn:
		return refused(plugin + " is CRIU's own CUDA plugin, not cuda-criu's",
			       "point --libdir at the directory of this project's cuda_plugin.so");
	case PluginFile::Ours:
		break;
	}
	Preflight p;
	p.ok = true;
	p.criu = loc->path;
	p.version = *version;
	p.plugin = plugin;
	return p;
}

} // namespace cuda_criu::cli
