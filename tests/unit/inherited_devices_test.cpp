#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/inherited_devices.h"
#include "image/devices_image.h"
#include "os/nvidia_files.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

struct TempDir {
	std::string path;
	UniqueFd fd;
	TempDir()
	{
		char tmpl[] = "/tmp/inherited-test.XXXXXX";
		path = mkdtemp(tmpl);
		fd = UniqueFd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	}
	~TempDir() { std::system(("rm -rf " + path).c_str()); }
};

int flags_of(int fd) { return fcntl(fd, F_GETFL); }

TEST(DevicesImage, RoundTripAndRejectsDamage)
{
	InheritedDevicesRecord r;
	r.mapped_paths = {"/dev/nvidiactl", "/dev/nvidia0"};
	r.files.push_back({0x11, O_RDWR, "/dev/nvidiactl"});
	r.files.push_back({0x2a, O_WRONLY | O_NONBLOCK, "/dev/nvidia-uvm"});
	auto bytes = encode_devices_image(r);
	auto back = decode_devices_image(bytes.data(), bytes.size());
	ASSERT_TRUE(back) << back.error().message();
	EXPECT_EQ(back->mapped_paths, r.mapped_paths);
	ASSERT_EQ(back->files.size(), 2u);
	EXPECT_EQ(back->files[1].id, 0x2au);
	EXPECT_EQ(back->files[1].flags, static_cast<uint32_t>(O_WRONLY | O_NONBLOCK));
	EXPECT_EQ(back->files[1].path, "/dev/nvidia-uvm");

	EXPECT_FALSE(decode_devices_image(bytes.data(), bytes.size() - 1));
	bytes[0] = 'X';
	auto bad = decode_devices_image(bytes.data(), bytes.size());
	ASSERT_FALSE(bad);
	EXPECT_NE(bad.error().message().find("bad magic"), std::string::npos);
}

TEST(NvidiaFiles, OrdinaryFilesAreNotClaimed)
{
	unsetenv("FAKEGPU_DIR");
	TempDir dir;
	for (const char *path : {"/dev/null", "/dev/zero", "/proc/self/status"}) {
		UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
		ASSERT_TRUE(fd.valid()) << path;
		struct stat st;
		ASSERT_EQ(fstat(fd.get(), &st), 0);
		EXPECT_FALSE(is_nvidia_device_file(fd.get(), st)) << path;
	}
	// A regular file named like a device node is not one.
	std::string fake = dir.path + "/nvidia0";
	UniqueFd fd(open(fake.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
	struct stat st;
	ASSERT_EQ(fstat(fd.get(), &st), 0);
	EXPECT_FALSE(is_nvidia_device_file(fd.get(), st));
	InheritedDevicesDump dump(dir.fd.get());
	auto r = dump.claim_file(fd.get(), 7);
	ASSERT_TRUE(r);
	EXPECT_FALSE(*r);
	EXPECT_FALSE(dump.claimed_any());
	EXPECT_NE(faccessat(dir.fd.get(), kDevicesImageFileName, F_OK, 0), 0); // nothing written
}

// The test seam: a device node under $FAKEGPU_DIR/dev/ counts; needs mknod (root).
TEST(NvidiaFiles, FakeDeviceNodeIsClaimedAndRestoredAsPlaceholders)
{
	TempDir dir;
	std::string devdir = dir.path + "/dev", node = devdir + "/nvidia-mappable";
	ASSERT_EQ(mkdir(devdir.c_str(), 0755), 0);
	if (mknod(node.c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0) // the rdev of /dev/null
		GTEST_SKIP() << "mknod: " << strerror(errno);
	UniqueFd fd(open(node.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
	ASSERT_TRUE(fd.valid());
	struct stat st;
	ASSERT_EQ(fstat(fd.get(), &st), 0);
	unsetenv("FAKEGPU_DIR");
	EXPECT_FALSE(is_nvidia_device_file(fd.get(), st)); // no seam in production
	setenv("FAKEGPU_DIR", dir.path.c_str(), 1);
	EXPECT_TRUE(is_nvidia_device_file(fd.get(), st));

	InheritedDevicesDump dump(dir.fd.get());
	auto m = dump.claim_mapping(fd.get(), st);
	ASSERT_TRUE(m) << m.error().message();
	EXPECT_TRUE(*m);
	auto f = dump.claim_file(fd.get(), 0x33);
	ASSERT_TRUE(f) << f.error().message();
	EXPECT_TRUE(*f);
	unsetenv("FAKEGPU_DIR");

	InheritedDevicesRestore restore(dir.fd.get());
	ASSERT_TRUE(restore.load());
	auto mfd = restore.mapping_fd(node.c_str());
	ASSERT_TRUE(mfd);
	ASSERT_TRUE(mfd->has_value());
	UniqueFd zero(**mfd);
	ASSERT_EQ(fstat(zero.get(), &st), 0);
	EXPECT_EQ(st.st_rdev, makedev(1, 5)); // /dev/zero
	EXPECT_EQ(flags_of(zero.get()) & O_ACCMODE, O_RDWR);
	auto moved = restore.mapping_fd("/dev/nvidia-mappable"); // the same node seen through other mounts
	ASSERT_TRUE(moved);
	ASSERT_TRUE(moved->has_value());
	close(**moved);
	auto none = restore.mapping_fd("/dev/other");
	ASSERT_TRUE(none);
	EXPECT_FALSE(none->has_value());

	auto ffd = restore.file_fd(0x33);
	ASSERT_TRUE(ffd);
	ASSERT_TRUE(ffd->has_value());
	UniqueFd null(**ffd);
	EXPECT_EQ(flags_of(null.get()) & (O_ACCMODE | O_NONBLOCK), O_WRONLY | O_NONBLOCK);
	ASSERT_EQ(fstat(null.get(), &st), 0);
	EXPECT_EQ(st.st_rdev, makedev(1, 3)); // /dev/null
	auto other = restore.file_fd(0x34);
	ASSERT_TRUE(other);
	EXPECT_FALSE(other->has_value());
}

TEST(InheritedDevicesRestore, NoImageMeansNothingIsOurs)
{
	TempDir dir;
	InheritedDevicesRestore restore(dir.fd.get());
	ASSERT_TRUE(restore.load());
	auto f = restore.file_fd(1);
	ASSERT_TRUE(f);
	EXPECT_FALSE(f->has_value());
}

} // namespace
} // namespace cuda_criu
