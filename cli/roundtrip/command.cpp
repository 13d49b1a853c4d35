// cuda-criu roundtrip: the command line, then the round trip.
#include "roundtrip.h"
#include "roundtrip/cycle.h"

namespace cuda_criu::cli {

int cmd_roundtrip(const Args &args)
{
	roundtrip::RoundtripOptions o;
	if (auto rc = roundtrip::parse_roundtrip_options(args, o))
		return *rc;
	return roundtrip::run_roundtrip(o);
}

} // namespace cuda_criu::cli
