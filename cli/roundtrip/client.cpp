#include "roundtrip/client.h"

#include <cstdio>

#include "base/format.h"
#include "cli.h"
#include "roundtrip.h"

namespace cuda_criu::cli::roundtrip {

std::string RoundtripClient::criu_hint(const Step &s, const CriuResult &r) const
{
	return r.timed_out ? format("a larger program may need a longer --%s-timeout", s.name.c_str()) : std::string();
}

int refuse_not_root(const Client &client)
{
	const std::string line = client.command_line();
	std::fprintf(stderr, "%s: needs root, as CRIU does: run 'sudo %s'\n", line.substr(0, line.find(" ...")).c_str(),
		     line.c_str());
	return kExitRoundtripNotRun;
}

int RoundtripClient::show_result(const RunInfo &run, const std::vector<Step> &steps) const
{
	int status = kExitOk;
	if (const Step *failed = failed_step(steps))
		status = failed->cycle == 0 ? kExitRoundtripNotRun : kExitFailure;
	print_summary(run, steps);
	bool written = true;
	if (!o_.json_path.empty())
		written &= write_report(o_.json_path, json_report(run, steps, status), "--json");
	if (!o_.junit_path.empty())
		written &= write_report(o_.junit_path, junit_report(run, steps), "--junit");
	if (!written && status == kExitOk)
		status = kExitRoundtripNotRun;
	return status;
}

} // namespace cuda_criu::cli::roundtrip
