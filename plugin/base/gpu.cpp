#include "base/gpu.h"

#include <cstdio>

#include "base/text.h"

namespace cuda_criu {

const char *to_string(CudaState state)
{
	switch (state) {
	case CudaState::Running:
		return "running";
	case CudaState::Locked:
		return "locked";
	case CudaState::Checkpointed:
		return "checkpointed";
	case CudaState::Failed:
		return "failed";
	}
	return "unknown";
}

Result<CudaState> parse_cuda_state(const std::string &text)
{
	for (CudaState s : {CudaState::Running, CudaState::Locked, CudaState::Checkpointed, CudaState::Failed})
		if (text == to_string(s))
			return s;
	return make_error(EINVAL, "unknown CUDA state '%s'", printable(text).c_str());
}

std::string GpuUuid::str() const
{
	const auto &b = bytes;
	return format("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
		      b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

Result<GpuUuid> GpuUuid::parse(const std::string &text)
{
	std::string hex;
	std::string rest = text.rfind("GPU-", 0) == 0 ? text.substr(4) : text;
	for (char c : rest) {
		if (c == '-')
			continue;
		if (!std::isxdigit(static_cast<unsigned char>(c)))
			return make_error(EINVAL, "bad GPU UUID '%s': unexpected character", printable(text).c_str());
		hex += c;
	}
	if (hex.size() != 32)
		return make_error(EINVAL, "bad GPU UUID '%s': expected 32 hex digits", printable(text).c_str());
	GpuUuid uuid;
	for (size_t i = 0; i < 16; i++)
		uuid.bytes[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
	return uuid;
}

} // namespace cuda_criu
