// criu dump and criu restore as the round trip runs them (and selftest, its client): our plugin's
// directory, a verbose log in the image directory, CRIU's output in the work directory, a deadline, and
// the lines that explain a failure. While CRIU runs, the plugin's progress lines of its log show on
// stderr (cli/progress_display.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "roundtrip/logs.h"
#include "roundtrip/workdir.h"

namespace cuda_criu::cli::roundtrip {

// How a run of CRIU ended. Not ok: message ("criu dump exited with status 1") and the lines that explain
// it.
struct CriuResult {
	bool ok = false;
	bool interrupted = false; // by a signal to this program (CRIU killed)
	bool timed_out = false;   // CRIU killed at the deadline
	std::string message;
	std::vector<LogBlock> logs;
};

struct CriuSetup {
	std::string path;                    // the criu binary
	std::string libdir;                  // -L: our plugin's directory
	std::vector<std::string> env;        // added to CRIU's environment
	std::vector<std::string> extra_args; // added to every dump and restore
};

class Criu {
public:
	Criu(CriuSetup setup, const WorkDir &work) : setup_(std::move(setup)), work_(&work) {}

	// criu dump -t pid -D images (its log images/dump.log); tag names CRIU's output file (criu-dump-TAG.out).
	CriuResult dump(pid_t pid, const std::string &images, const std::string &tag, const std::vector<std::string> &more,
			unsigned timeout_ms) const;
	// criu restore -D images -d (its log images/restore.log); env_more added to CRIU's environment.
	CriuResult restore(const std::string &images, const std::string &tag, const std::vector<std::string> &more,
			   const std::vector<std::string> &env_more, unsigned timeout_ms) const;

private:
	CriuResult run(const char *action, std::vector<std::string> args, const std::vector<std::string> &env,
		       const std::string &log, const std::string &tag, unsigned timeout_ms) const;

	CriuSetup setup_;
	const WorkDir *work_;
};

} // namespace cuda_criu::cli::roundtrip
