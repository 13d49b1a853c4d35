// cuda-criu roundtrip: the command line, then the round trip.
#include "commands.h"
#include "roundtrip.h"
#include "roundtrip/cycle.h"

namespace cuda_criu::cli {

int cmd_roundtrip(const Invocation &in)
{
	roundtrip::RoundtripOptions o;
	if (auto rc = roundtrip::parse_roundtrip_options(in.args, o))
		return *rc;
	return roundtrip::run_roundtrip(o);
}

} // namespace cuda_criu::cli
