#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "image/image.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

ImageRecord sample()
{
	ImageRecord r;
	r.driver_version = "580.159.04";
	r.plugin_version = "0.1.0";
	r.gpus.push_back({*GpuUuid::parse("GPU-01234567-89ab-cdef-0123-456789abcdef"), "NVIDIA H200", 150000000000ULL,
			  "0000:19:00.0", 0});
	r.other_gpus.push_back({*GpuUuid::parse("GPU-11234567-89ab-cdef-0123-456789abcdef"), "NVIDIA H200", 0, "0000:1a:00.0", -1});
	r.processes.push_back({4242, 1, CudaState::Running, {*GpuUuid::parse("GPU-01234567-89ab-cdef-0123-456789abcdef")}, 4ULL << 30,
			       1200, 3400000});
	r.processes.push_back({4243, 2, CudaState::Locked, {}, 0, 0, 0});
	r.device_phase_us = 3500000;
	r.created_unix = 1764460800;
	r.hostname = "node1";
	return r;
}

TEST(Image, RoundTrip)
{
	auto bytes = encode_image(sample());
	auto r = decode_image(bytes.data(), bytes.size());
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(r->version, 1u); // 2 only with a GPU image of the plugin
	EXPECT_EQ(r->driver_version, "580.159.04");
	ASSERT_EQ(r->gpus.size(), 1u);
	EXPECT_EQ(r->gpus[0].name, "NVIDIA H200");
	EXPECT_EQ(r->gpus[0].memory_bytes, 150000000000ULL);
	ASSERT_EQ(r->other_gpus.size(), 1u);
	EXPECT_EQ(r->other_gpus[0].pci_bus_id, "0000:1a:00.0");
	EXPECT_EQ(r->other_gpus[0].ordinal, -1);
	ASSERT_EQ(r->processes.size(), 2u);
	EXPECT_EQ(r->processes[0].pid, 4242);
	EXPECT_EQ(r->processes[0].ns_pid, 1);
	EXPECT_EQ(r->processes[0].state_bytes, 4ULL << 30);
	EXPECT_EQ(r->processes[0].gpu_uuids.size(), 1u);
	EXPECT_EQ(r->processes[1].initial_state, CudaState::Locked);
	EXPECT_EQ(r->hostname, "node1");
}

// Typed in memory, text on disk as before: old images and old readers see the same strings.
TEST(Image, StatesAndUuidsAreTextOnDisk)
{
	auto bytes = encode_image(sample());
	std::string text(bytes.begin(), bytes.end());
	EXPECT_NE(text.find("running"), std::string::npos);
	EXPECT_NE(text.find("locked"), std::string::npos);
	EXPECT_NE(text.find("GPU-01234567-89ab-cdef-0123-456789abcdef"), std::string::npos);
}

std::vector<uint8_t> framed(const std::string &payload)
{
	std::string header("CUDACRIU\0\0\0\0", 12);
	for (int i = 0; i < 4; i++)
		header[8 + i] = static_cast<char>(payload.size() >> (8 * i));
	std::string all = header + payload;
	return std::vector<uint8_t>(all.begin(), all.end());
}

// A process without initial_state (the field is optional) is accepted; a state no plugin writes is not.
TEST(Image, AbsentStateIsAcceptedUnknownStateIsNot)
{
	auto r = decode_image(framed(std::string("\x08\x01\x2a\x02\x08\x07", 6)).data(), 12 + 6);
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_FALSE(r->processes[0].initial_state.has_value());
	auto bad = framed(std::string("\x08\x01\x2a\x07\x08\x07\x1a\x03zzz", 11));
	auto r2 = decode_image(bad.data(), bad.size());
	ASSERT_FALSE(r2.ok());
	EXPECT_NE(r2.error().message().find("unknown CUDA state 'zzz'"), std::string::npos) << r2.error().message();
}

// A 4 MiB image naming a million processes (4 bytes each) is refused, not decoded into hundreds of MiB.
TEST(Image, MoreProcessesThanAMachineHoldsAreRefused)
{
	std::string payload = "\x08\x01";
	while (payload.size() + 4 <= kImageMaxBytes - 12)
		payload += std::string("\x2a\x02\x08\x01", 4);
	auto bytes = framed(payload);
	auto r = decode_image(bytes.data(), bytes.size());
	ASSERT_FALSE(r.ok()) << r->processes.size() << " processes accepted";
	EXPECT_NE(r.error().message().find("corrupt image"), std::string::npos) << r.error().message();

	ImageRecord many;
	for (int pid = 1; pid <= static_cast<int>(kImageMaxProcesses) + 1; pid++)
		many.processes.push_back({pid, pid, CudaState::Running, {}, 0, 0, 0});
	auto big = encode_image(many);
	auto r2 = decode_image(big.data(), big.size());
	ASSERT_FALSE(r2.ok());
	EXPECT_NE(r2.error().message().find("65537 processes"), std::string::npos) << r2.error().message();
}

TEST(Image, MoreGpusOrLongerTextsThanAMachineHasAreRefused)
{
	ImageRecord r = sample();
	r.processes[0].gpu_uuids.assign(kImageMaxGpus + 1, r.gpus[0].uuid);
	auto bytes = encode_image(r);
	EXPECT_FALSE(decode_image(bytes.data(), bytes.size()).ok()) << "a process with 65 GPUs";
	r = sample();
	r.other_gpus.assign(kImageMaxGpus + 1, r.other_gpus[0]);
	bytes = encode_image(r);
	EXPECT_FALSE(decode_image(bytes.data(), bytes.size()).ok()) << "65 other GPUs";
	r = sample();
	r.gpus[0].name.assign(kImageMaxStringBytes + 1, 'x');
	bytes = encode_image(r);
	EXPECT_FALSE(decode_image(bytes.data(), bytes.size()).ok()) << "a 257-byte GPU name";
	r = sample();
	r.gpus[0].name.assign(kImageMaxStringBytes, 'x');
	bytes = encode_image(r);
	EXPECT_TRUE(decode_image(bytes.data(), bytes.size()).ok()) << "a 256-byte GPU name";
}

TEST(Image, EveryTruncationIsAClearError)
{
	auto bytes = encode_image(sample());
	for (size_t n = 0; n < bytes.size(); n++) {
		auto r = decode_image(bytes.data(), n);
		EXPECT_FALSE(r.ok()) << "truncated to " << n;
	}
}

TEST(Image, BadMagicIsRefused)
{
	auto bytes = encode_image(sample());
	bytes[0] = 'X';
	auto r = decode_image(bytes.data(), bytes.size());
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("magic"), std::string::npos);
}

TEST(Image, NewerVersionIsRefusedWithAHint)
{
	auto bytes = encode_image(sample());
	// The version is field 1, a varint right after the 12-byte header: 0x08 <version>.
	ASSERT_EQ(bytes[12], 0x08);
	bytes[13] = static_cast<uint8_t>(kImageVersion + 1);
	auto r = decode_image(bytes.data(), bytes.size());
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("newer"), std::string::npos) << r.error().message();
}

TEST(Image, CorruptPayloadIsRefused)
{
	auto bytes = encode_image(sample());
	for (size_t i = 12; i < bytes.size(); i++)
		bytes[i] = 0xff;
	EXPECT_FALSE(decode_image(bytes.data(), bytes.size()).ok());
}

class ImageDir : public ::testing::Test {
protected:
	std::string dir;
	UniqueFd fd;
	void SetUp() override
	{
		char tmpl[] = "/tmp/cuda-criu-image-XXXXXX";
		dir = mkdtemp(tmpl);
		fd = UniqueFd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	}
	void TearDown() override { std::system(("rm -rf " + dir).c_str()); }
};

TEST_F(ImageDir, WriteThenRead)
{
	ASSERT_TRUE(write_image(fd.get(), sample()).ok());
	struct stat st;
	ASSERT_EQ(stat((dir + "/" + kImageFileName).c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 0777, 0644u) << "same permissions as CRIU's images";
	auto r = read_image(fd.get());
	ASSERT_TRUE(r.ok()) << r.error().message();
	ASSERT_TRUE(r->has_value());
	EXPECT_EQ((*r)->processes.size(), 2u);
}

TEST_F(ImageDir, MissingFileMeansInTreeImage)
{
	auto r = read_image(fd.get());
	ASSERT_TRUE(r.ok());
	EXPECT_FALSE(r->has_value());
}

TEST_F(ImageDir, SymlinkIsRefused)
{
	ASSERT_EQ(symlink("/etc/passwd", (dir + "/" + kImageFileName).c_str()), 0);
	auto r = read_image(fd.get());
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("symbolic link"), std::string::npos);
	EXPECT_FALSE(write_image(fd.get(), sample()).ok()) << "never writes through a symlink";
}

TEST_F(ImageDir, OversizedFileIsRefusedWithoutReadingIt)
{
	int f = open((dir + "/" + kImageFileName).c_str(), O_WRONLY | O_CREAT, 0600);
	ASSERT_GE(f, 0);
	ASSERT_EQ(ftruncate(f, 1LL << 40), 0); // sparse 1 TiB
	close(f);
	auto r = read_image(fd.get());
	ASSERT_FALSE(r.ok());
	EXPECT_EQ(r.error().errno_value(), EFBIG);
}

} // namespace
} // namespace cuda_criu
