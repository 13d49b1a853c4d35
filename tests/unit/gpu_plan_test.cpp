#include <gtest/gtest.h>

#include "core/gpu_plan.h"

namespace cuda_criu {
namespace {

GpuInfo gpu(int ordinal, uint8_t id, const char *name, uint64_t mem = 80ULL << 30)
{
	GpuInfo g;
	g.ordinal = ordinal;
	g.uuid.bytes[15] = id;
	g.name = name;
	g.memory_bytes = mem;
	return g;
}

GpuRecord rec(const GpuInfo &g) { return {g.uuid.str(), g.name, g.memory_bytes, "", g.ordinal}; }

// An image of processes on the given GPUs (one process per GPU, `bytes` of state each).
ImageRecord image_on(std::vector<GpuInfo> gpus, uint64_t bytes = 1ULL << 30)
{
	ImageRecord r;
	int pid = 100;
	for (const GpuInfo &g : gpus) {
		r.gpus.push_back(rec(g));
		r.processes.push_back({pid, pid, "running", {g.uuid.str()}, bytes, 0, 0});
		pid++;
	}
	return r;
}

const GpuInfo A0 = gpu(0, 0xa0, "NVIDIA H200"), A1 = gpu(1, 0xa1, "NVIDIA H200"), A2 = gpu(2, 0xa2, "NVIDIA H200");
const GpuInfo B0 = gpu(0, 0xb0, "NVIDIA H200"), B1 = gpu(1, 0xb1, "NVIDIA H200");
const GpuInfo C0 = gpu(0, 0xc0, "NVIDIA A100");

TEST(GpuPlan, SameGpusNeedNoPairs)
{
	auto p = plan_gpus(image_on({A0, A1}), {A0, A1}, {}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	EXPECT_TRUE(p->pairs.empty());
}

TEST(GpuPlan, AutomaticRemapPairsSameModelInOrdinalOrder)
{
	auto p = plan_gpus(image_on({A1, A0}), {B0, B1}, {}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	// Every GPU of the image is listed; A0 -> B0 and A1 -> B1 whatever the image's order.
	for (const GpuPair &pair : p->pairs)
		EXPECT_EQ(pair.to.bytes[15], pair.from.bytes[15] == 0xa0 ? 0xb0 : 0xb1);
	EXPECT_NE(p->description.find("automatic"), std::string::npos);
}

TEST(GpuPlan, PartlyPresentKeepsThePresentOnesAndListsAll)
{
	auto p = plan_gpus(image_on({A0, A1}), {A1, B1}, {}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	for (const GpuPair &pair : p->pairs)
		EXPECT_EQ(pair.to.bytes[15], pair.from.bytes[15] == 0xa0 ? 0xb1 : 0xa1);
}

TEST(GpuPlan, WrongModelIsRefusedWithAHint)
{
	auto p = plan_gpus(image_on({A0}), {C0}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_NE(p.error().message().find("NVIDIA H200"), std::string::npos) << p.error().message();
	EXPECT_NE(p.error().message().find("CUDA_CRIU_DEVICE_MAP"), std::string::npos);
}

TEST(GpuPlan, TooFewGpusIsRefused)
{
	auto p = plan_gpus(image_on({A0, A1, A2}), {B0, B1}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_NE(p.error().message().find("3 x NVIDIA H200"), std::string::npos) << p.error().message();
}

TEST(GpuPlan, NoGpuAtAllIsRefused)
{
	EXPECT_FALSE(plan_gpus(image_on({A0}), {}, {}, "").ok());
}

TEST(GpuPlan, ExplicitMapByUuidAndByIndex)
{
	auto p = plan_gpus(image_on({A0, A1}), {A0, A1}, {}, A0.uuid.str() + "=" + A1.uuid.str() + ",1=0");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	for (const GpuPair &pair : p->pairs)
		EXPECT_EQ(pair.to.bytes[15], pair.from.bytes[15] == 0xa0 ? 0xa1 : 0xa0);
}

TEST(GpuPlan, ExplicitMapOntoTheSameGpuIsStillHandedToTheDriver)
{
	auto p = plan_gpus(image_on({A0}), {A0}, {}, "0=0");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 1u);
	EXPECT_EQ(p->pairs[0].from, p->pairs[0].to);
}

TEST(GpuPlan, ExplicitMapMayCrossModels)
{
	auto p = plan_gpus(image_on({A0}), {C0}, {}, "0=0");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 1u);
}

TEST(GpuPlan, ExplicitMapErrors)
{
	EXPECT_FALSE(plan_gpus(image_on({A0}), {A0}, {}, "7=0").ok()) << "7 is not a GPU of the image";
	EXPECT_FALSE(plan_gpus(image_on({A0}), {A0}, {}, "0=5").ok()) << "no GPU 5 here";
	EXPECT_FALSE(plan_gpus(image_on({A0}), {A0}, {}, "0").ok()) << "not OLD=NEW";
	EXPECT_FALSE(plan_gpus(image_on({A0, A1}), {A0, A1}, {}, "0=1,1=1").ok()) << "two onto one";
	auto unmapped = plan_gpus(image_on({A0, A1}), {B0, B1}, {}, "0=0");
	ASSERT_FALSE(unmapped.ok()) << "A1 is absent and not in the map";
	EXPECT_NE(unmapped.error().message().find("not in the device map"), std::string::npos);
}

TEST(GpuPlan, TooLittleMemoryIsRefused)
{
	GpuInfo small = gpu(0, 0xb0, "NVIDIA H200", 1ULL << 30);
	auto p = plan_gpus(image_on({A0}, 4ULL << 30), {small}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_EQ(p.error().errno_value(), ENOSPC);
	EXPECT_NE(p.error().message().find("4.0 GiB"), std::string::npos) << p.error().message();
}

TEST(GpuPlan, TooLittleFreeMemoryIsRefused)
{
	GpuInfo busy = gpu(0, 0xb0, "NVIDIA H200");
	busy.free_bytes = 2ULL << 30;
	auto p = plan_gpus(image_on({A0}, 3ULL << 30), {busy}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_EQ(p.error().errno_value(), ENOSPC);
	EXPECT_NE(p.error().message().find("2.0 GiB free now"), std::string::npos) << p.error().message();
	busy.free_bytes = 4ULL << 30;
	EXPECT_TRUE(plan_gpus(image_on({A0}, 3ULL << 30), {busy}, {}, "").ok());
}

TEST(GpuPlan, ProcessesOnOneGpuAddUp)
{
	ImageRecord img = image_on({A0}, 3ULL << 30);
	img.processes.push_back({200, 200, "running", {A0.uuid.str()}, 3ULL << 30, 0, 0});
	EXPECT_FALSE(plan_gpus(img, {gpu(0, 0xb0, "NVIDIA H200", 5ULL << 30)}, {}, "").ok()) << "6 GiB onto 5 GiB";
	EXPECT_TRUE(plan_gpus(img, {gpu(0, 0xb0, "NVIDIA H200", 7ULL << 30)}, {}, "").ok());
}

// The case measured on two H200s: a process that saw only GPU 0 (CUDA_VISIBLE_DEVICES=0) held only its
// device node; restored by a CRIU that may use only GPU 1. The driver took A0 -> A1 only together with
// A1 -> A0, so the GPU no process held is paired too, onto the GPU left over (hidden from CRIU).
TEST(GpuPlan, GpusNoProcessHeldArePairedWhenAnyGpuMoves)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	auto p = plan_gpus(img, {A1}, {A0, A1}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	EXPECT_EQ(p->pairs[0].from, A0.uuid);
	EXPECT_EQ(p->pairs[0].to, A1.uuid);
	EXPECT_EQ(p->pairs[1].from, A1.uuid);
	EXPECT_EQ(p->pairs[1].to, A0.uuid);
	EXPECT_NE(p->description.find("automatic: same model"), std::string::npos) << p->description;
	EXPECT_NE(p->description.find("held by no process"), std::string::npos) << p->description;
}

TEST(GpuPlan, GpusNoProcessHeldStayOnThemselvesWhenFree)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A2));
	auto p = plan_gpus(img, {A1, A2}, {A0, A1, A2}, "0=1");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	EXPECT_EQ(p->pairs[1].from, A2.uuid);
	EXPECT_EQ(p->pairs[1].to, A2.uuid);
}

TEST(GpuPlan, GpusNoProcessHeldAreNotPairedWhenNothingMoves)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	auto p = plan_gpus(img, {A0, A1}, {A0, A1}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	EXPECT_TRUE(p->pairs.empty());
}

TEST(GpuPlan, GpusNoProcessHeldWithoutAPartnerAreLeftOutAndSaidSo)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	img.other_gpus.push_back(rec(C0));
	auto p = plan_gpus(img, {B0}, {B0}, ""); // a one-GPU machine: only the GPU the process held is paired
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 1u);
	EXPECT_EQ(p->pairs[0].to, B0.uuid);
	EXPECT_NE(p->description.find("left unpaired"), std::string::npos) << p->description;
}

TEST(GpuPlan, MapLeavingAHeldGpuOnATakenGpuSaysSo)
{
	auto p = plan_gpus(image_on({A0, A1}), {A0, A1}, {}, "0=1");
	ASSERT_FALSE(p.ok());
	EXPECT_NE(p.error().message().find("taken by another pair"), std::string::npos) << p.error().message();
}

TEST(DriverVersion, OnlyADifferentKnownVersionIsRefused)
{
	ImageRecord img;
	img.driver_version = "580.159.04";
	EXPECT_TRUE(check_driver_version(img, "580.159.04").ok());
	EXPECT_TRUE(check_driver_version(img, "").ok()) << "version here unknown";
	auto st = check_driver_version(img, "575.57.08");
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("dumped under NVIDIA driver 580.159.04 and this machine runs 575.57.08"),
		  std::string::npos)
		<< st.error().message();
	img.driver_version = "CUDA 13.0"; // no kernel module version was known when dumping
	EXPECT_TRUE(check_driver_version(img, "575.57.08").ok());
	img.driver_version = "";
	EXPECT_TRUE(check_driver_version(img, "575.57.08").ok());
}

} // namespace
} // namespace cuda_criu
