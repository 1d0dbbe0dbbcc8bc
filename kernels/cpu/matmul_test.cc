// Matmul tests: bit-identity (memcmp) of scalar / AVX2 / AVX-512 / MatmulReference across shapes,
// dtypes, storages and thread counts; a split-K negative control; accuracy vs double; bad input.

#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/math.h"
#include "kernels/cpu/matmul_internal.h"

namespace bitroll::kernels {
namespace {

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

void WarnMissingIsas() {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!IsaSupported(isa)) {
      std::printf("WARNING: CPU lacks %s: that path is NOT TESTED here\n", IsaName(isa));
    }
  }
}

// Packs one fp32 matrix [n][k] and returns the unpacked (possibly bf16-rounded) copy in `w_out`.
PackedMatrix PackF32(const std::vector<float>& w, int64_t n, int64_t k, DType storage,
                     std::vector<float>* w_out) {
  const MatrixPart part{w.data(), DType::kF32, n};
  Result<PackedMatrix> packed =
      PackedMatrix::Pack(std::span<const MatrixPart>(&part, 1), k, storage);
  EXPECT_TRUE(packed.ok()) << packed.status().ToString();
  PackedMatrix pm = std::move(packed).value();
  w_out->resize(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) pm.UnpackRow(r, w_out->data() + r * k);
  return pm;
}

std::vector<float> RunMatmul(Isa isa, const std::vector<float>& x, int64_t m, int64_t k,
                             const PackedMatrix& w, const float* bias, ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(m * w.n()), -12345.0f);
  MatmulParams p;
  p.x = x.data();
  p.m = m;
  p.ldx = k;
  p.w = &w;
  p.bias = bias;
  p.y = y.data();
  p.ldy = w.n();
  Matmul(isa, p, pool);
  return y;
}

TEST(MatmulTest, AllIsasEqualReferenceBitwise) {
  WarnMissingIsas();
  const std::vector<Isa> isas = SupportedIsas();
  int cases = 0;
  for (DType storage : {DType::kF32, DType::kBF16}) {
    for (int64_t k : {1, 3, 17, 64, 129}) {
      for (int64_t n : {1, 15, 16, 17, 33, 50, 100, 130}) {
        const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 7 + n * 131 + k);
        const std::vector<float> bias = RandomFloats(static_cast<size_t>(n), 99 + n);
        std::vector<float> w_unpacked;
        const PackedMatrix pm = PackF32(w, n, k, storage, &w_unpacked);
        for (int64_t m = 1; m <= 17; m += (k > 64 ? 4 : 1)) {
          const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 1000 + m);
          for (bool with_bias : {false, true}) {
            const float* b = with_bias ? bias.data() : nullptr;
            std::vector<float> want(static_cast<size_t>(m * n));
            MatmulReference(x.data(), m, w_unpacked.data(), n, k, b, want.data());
            for (Isa isa : isas) {
              const std::vector<float> got = RunMatmul(isa, x, m, k, pm, b, nullptr);
              ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                  << IsaName(isa) << " m=" << m << " n=" << n << " k=" << k << " bias=" << with_bias
                  << " bf16=" << (storage == DType::kBF16);
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 500);
}

TEST(MatmulTest, ThreadCountsGiveIdenticalBits) {
  WarnMissingIsas();
  // m = 70 crosses the 64-row task chunk; n = 300 gives 19 column blocks (a partial last block);
  // k = 256 makes even one row big enough to be split across the pool.
  const int64_t m = 70, n = 300, k = 256;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 5);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 6);
  const std::vector<float> bias = RandomFloats(static_cast<size_t>(n), 8);
  for (DType storage : {DType::kF32, DType::kBF16}) {
    std::vector<float> w_unpacked;
    const PackedMatrix pm = PackF32(w, n, k, storage, &w_unpacked);
    std::vector<float> want(static_cast<size_t>(m * n));
    MatmulReference(x.data(), m, w_unpacked.data(), n, k, bias.data(), want.data());
    for (Isa isa : SupportedIsas()) {
      for (int threads : {1, 2, 3, 4}) {
        ThreadPool pool(threads);
        for (int64_t rows : {int64_t{1}, int64_t{7}, m}) {  // also batch sizes 1 and 7
          const std::vector<float> got = RunMatmul(isa, x, rows, k, pm, bias.data(), &pool);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), got.size() * sizeof(float)), 0)
              << IsaName(isa) << " threads=" << threads << " rows=" << rows;
        }
      }
    }
  }
}

// The batched-decode and prefill sizes (issue 19): row counts around the 8-row register tile and
// the 64-row task chunk, column counts that leave 1, 2 or 3 blocks in a task's last panel (the
// next-panel prefetch of the AVX-512 tile runs over every panel boundary), on 1-3 threads.
TEST(MatmulTest, BatchedRowsAndPanelsGiveReferenceBits) {
  WarnMissingIsas();
  const int64_t k = 96;
  for (int64_t n : {int64_t{40}, int64_t{130}, int64_t{700}}) {
    const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 21 + n);
    const std::vector<float> bias = RandomFloats(static_cast<size_t>(n), 22 + n);
    for (DType storage : {DType::kF32, DType::kBF16}) {
      std::vector<float> w_unpacked;
      const PackedMatrix pm = PackF32(w, n, k, storage, &w_unpacked);
      for (int64_t m : {3, 9, 16, 31, 32, 47, 49, 64, 97, 130, 257}) {
        const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 23 + m);
        std::vector<float> want(static_cast<size_t>(m * n));
        MatmulReference(x.data(), m, w_unpacked.data(), n, k, bias.data(), want.data());
        for (Isa isa : SupportedIsas()) {
          for (int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            const std::vector<float> got = RunMatmul(isa, x, m, k, pm, bias.data(), &pool);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), got.size() * sizeof(float)), 0)
                << IsaName(isa) << " m=" << m << " n=" << n << " threads=" << threads
                << " bf16=" << (storage == DType::kBF16);
          }
        }
      }
    }
  }
}

// The task grid of a pooled call (speed only, so checked as a plan): every row and column block
// in exactly one task, cut at whole tiles, tasks differing by at most one tile, at most
// kMaxTaskRows rows per task rounded to the tile, and a task count that is a multiple of the
// thread count unless the column tiles run out. (The old fixed 48-row chunks gave 11 tasks for
// 512 rows on 2 threads, one thread running 6 of them; a plan without the rounding to a multiple
// of the thread count fails this test.)
TEST(MatmulTest, TaskGridCoversEverythingInBalancedTiles) {
  using internal::MatmulGrid;
  int plans = 0;
  for (internal::TileShape tile :
       {internal::MatmulTileShapeScalar(64), internal::MatmulTileShapeAvx2(1),
        internal::MatmulTileShapeAvx2(64), internal::MatmulTileShapeAvx512(2),
        internal::MatmulTileShapeAvx512(64)}) {
    for (int64_t m : {1, 2, 3, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 256, 300, 448, 512, 1000}) {
      for (int64_t nb : {1, 2, 3, 5, 16, 48, 144, 256, 2000}) {
        for (int threads : {1, 2, 3, 4, 8}) {
          const MatmulGrid g = internal::PlanMatmulGrid(m, nb, tile, threads);
          const std::string what = "tile " + std::to_string(tile.rows) + "x" +
                                   std::to_string(tile.blocks) + " m=" + std::to_string(m) +
                                   " nb=" + std::to_string(nb) + " t=" + std::to_string(threads);
          // One direction of the grid: n tasks from begin(0) = 0 to begin(n) = total, each
          // non-empty and starting on a whole tile; returns the smallest and largest task.
          auto check = [&](int64_t n, auto begin, int64_t total, int64_t unit) {
            EXPECT_EQ(begin(0), 0) << what;
            EXPECT_EQ(begin(n), total) << what;
            std::pair<int64_t, int64_t> size{total, 0};
            for (int64_t i = 0; i < n; ++i) {
              const int64_t a = begin(i), b = begin(i + 1);
              EXPECT_LT(a, b) << what << " task " << i << " of " << n;
              EXPECT_EQ(a % unit, 0) << what;
              size = {std::min(size.first, b - a), std::max(size.second, b - a)};
            }
            return size;
          };
          const auto [row_min, row_max] = check(
              g.row_tasks, [&](int64_t i) { return g.RowBegin(i); }, m, tile.rows);
          const auto [col_min, col_max] = check(
              g.col_tasks, [&](int64_t j) { return g.BlockBegin(j); }, nb, tile.blocks);
          // At most one tile apart (the last task may also hold a partial tile).
          EXPECT_LT(row_max - row_min, 2 * tile.rows) << what;
          EXPECT_LT(col_max - col_min, 2 * tile.blocks) << what;
          EXPECT_LE(row_max, MatmulGrid::kMaxTaskRows + tile.rows) << what;
          const int64_t col_units = (nb + tile.blocks - 1) / tile.blocks;
          EXPECT_TRUE(g.tasks() % threads == 0 || g.col_tasks == col_units) << what;
          EXPECT_TRUE(g.tasks() >= MatmulGrid::kTasksPerThread * threads ||
                      g.col_tasks == col_units)
              << what;
          ++plans;
        }
      }
    }
  }
  EXPECT_GT(plans, 3000);
}

TEST(MatmulTest, StridesAreHonouredAndPaddingUntouched) {
  const int64_t m = 5, n = 21, k = 19, ldx = 23, ldy = 30;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 11);
  std::vector<float> x_strided = RandomFloats(static_cast<size_t>(m * ldx), 12);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < k; ++c) x[r * k + c] = x_strided[r * ldx + c];
  }
  std::vector<float> w_unpacked;
  const PackedMatrix pm = PackF32(w, n, k, DType::kF32, &w_unpacked);
  std::vector<float> want(static_cast<size_t>(m * n));
  MatmulReference(x.data(), m, w_unpacked.data(), n, k, nullptr, want.data());
  for (Isa isa : SupportedIsas()) {
    std::vector<float> y(static_cast<size_t>(m * ldy), 777.0f);
    MatmulParams p;
    p.x = x_strided.data();
    p.m = m;
    p.ldx = ldx;
    p.w = &pm;
    p.y = y.data();
    p.ldy = ldy;
    Matmul(isa, p, nullptr);
    for (int64_t r = 0; r < m; ++r) {
      ASSERT_EQ(std::memcmp(&want[r * n], &y[r * ldy], n * sizeof(float)), 0) << IsaName(isa);
      for (int64_t c = n; c < ldy; ++c) ASSERT_EQ(y[r * ldy + c], 777.0f) << IsaName(isa);
    }
  }
}

// Batch invariance stated directly: a row's output does not depend on the other rows in the batch.
TEST(MatmulTest, RowResultIndependentOfBatch) {
  const int64_t n = 70, k = 96;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 21);
  std::vector<float> w_unpacked;
  const PackedMatrix pm = PackF32(w, n, k, DType::kF32, &w_unpacked);
  const std::vector<float> batch = RandomFloats(static_cast<size_t>(33 * k), 22);
  ThreadPool pool(2);
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> full = RunMatmul(isa, batch, 33, k, pm, nullptr, &pool);
    for (int64_t r : {0, 8, 17, 32}) {
      const std::vector<float> one(batch.begin() + r * k, batch.begin() + (r + 1) * k);
      const std::vector<float> alone = RunMatmul(isa, one, 1, k, pm, nullptr, nullptr);
      ASSERT_EQ(std::memcmp(alone.data(), &full[r * n], n * sizeof(float)), 0) << IsaName(isa);
    }
  }
}

// A batch-variant kernel compiled only into this test: split K in two halves when m > 1 and sum
// the partials at the end (what a split-K GEMM does for throughput). It must differ in bits from
// the canonical result, which proves the memcmp checks above can fail.
void SplitKMatmul(const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y) {
  const int64_t splits = m > 1 ? 2 : 1;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float total = 0.0f;
      for (int64_t s = 0; s < splits; ++s) {
        float acc = 0.0f;
        for (int64_t kk = s * k / splits; kk < (s + 1) * k / splits; ++kk) {
          acc = std::fma(x[i * k + kk], w[j * k + kk], acc);
        }
        total = total + acc;
      }
      y[i * n + j] = total;
    }
  }
}

TEST(MatmulTest, NegativeControlSplitKDiffers) {
  const int64_t m = 4, n = 64, k = 256;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 31);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 32);
  std::vector<float> w_unpacked;
  const PackedMatrix pm = PackF32(w, n, k, DType::kF32, &w_unpacked);
  std::vector<float> split(static_cast<size_t>(m * n));
  SplitKMatmul(x.data(), m, w_unpacked.data(), n, k, split.data());
  for (Isa isa : SupportedIsas()) {
    const std::vector<float> canonical = RunMatmul(isa, x, m, k, pm, nullptr, nullptr);
    EXPECT_NE(std::memcmp(split.data(), canonical.data(), split.size() * sizeof(float)), 0)
        << IsaName(isa);
  }
  // With m == 1 the variant takes the canonical path, so it agrees: the check is about order.
  std::vector<float> one(static_cast<size_t>(n));
  SplitKMatmul(x.data(), 1, w_unpacked.data(), n, k, one.data());
  const std::vector<float> canonical1 = RunMatmul(Isa::kScalar, x, 1, k, pm, nullptr, nullptr);
  EXPECT_EQ(std::memcmp(one.data(), canonical1.data(), n * sizeof(float)), 0);
}

TEST(MatmulTest, AccuracyAgainstDouble) {
  const int64_t m = 3, n = 40, k = 768;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(n * k), 41, 0.05f);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 42);
  const std::vector<float> bias = RandomFloats(static_cast<size_t>(n), 43);
  std::vector<float> w_unpacked;
  const PackedMatrix pm = PackF32(w, n, k, DType::kF32, &w_unpacked);
  const std::vector<float> y = RunMatmul(BestIsa(), x, m, k, pm, bias.data(), nullptr);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = bias[j], mag = std::fabs(bias[j]);
      for (int64_t kk = 0; kk < k; ++kk) {
        want += static_cast<double>(x[i * k + kk]) * w[j * k + kk];
        mag += std::fabs(static_cast<double>(x[i * k + kk]) * w[j * k + kk]);
      }
      EXPECT_NEAR(y[i * n + j], want, 1e-6 * mag * 8) << i << "," << j;
    }
  }
}

TEST(MatmulTest, PackStacksPartsAndWidensExactly) {
  const int64_t k = 9;
  // Part 0: fp32 [5][k]; part 1: f16 [3][k]; part 2: bf16 [20][k].
  const std::vector<float> a = RandomFloats(5 * k, 51);
  std::vector<uint16_t> b(3 * k), c(20 * k);
  std::mt19937 rng(52);
  for (uint16_t& h : b) {  // any finite half, subnormals and both signs included
    h = static_cast<uint16_t>(rng() & 0xFFFF);
    if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;
  }
  for (uint16_t& h : c) h = F32ToBf16(std::normal_distribution<float>(0, 3)(rng));
  const MatrixPart parts[] = {
      {a.data(), DType::kF32, 5}, {b.data(), DType::kF16, 3}, {c.data(), DType::kBF16, 20}};
  Result<PackedMatrix> packed = PackedMatrix::Pack(parts, k);
  ASSERT_TRUE(packed.ok()) << packed.status().ToString();
  EXPECT_EQ(packed->n(), 28);
  EXPECT_EQ(packed->k(), k);
  EXPECT_EQ(packed->n_blocks(), 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(packed->f32_data()) % 64, 0u);
  std::vector<float> row(k);
  for (int64_t r = 0; r < 28; ++r) {
    packed->UnpackRow(r, row.data());
    for (int64_t kk = 0; kk < k; ++kk) {
      float want;
      if (r < 5) {
        want = a[r * k + kk];
      } else if (r < 8) {
        want = F16ToF32(b[(r - 5) * k + kk]);
      } else {
        want = Bf16ToF32(c[(r - 8) * k + kk]);
      }
      ASSERT_EQ(std::bit_cast<uint32_t>(row[kk]), std::bit_cast<uint32_t>(want)) << r << "," << kk;
    }
  }
  // bf16 storage: fp32 sources are rounded to nearest even, bf16 sources kept exactly.
  Result<PackedMatrix> packed16 = PackedMatrix::Pack(parts, k, DType::kBF16);
  ASSERT_TRUE(packed16.ok());
  EXPECT_EQ(packed16->storage(), DType::kBF16);
  EXPECT_EQ(packed16->f32_data(), nullptr);
  packed16->UnpackRow(0, row.data());
  for (int64_t kk = 0; kk < k; ++kk) EXPECT_EQ(row[kk], Bf16ToF32(F32ToBf16(a[kk])));
  packed16->UnpackRow(27, row.data());
  for (int64_t kk = 0; kk < k; ++kk) EXPECT_EQ(row[kk], Bf16ToF32(c[19 * k + kk]));
}

TEST(MatmulTest, CheckMatmulParamsNamesTheProblem) {
  const std::vector<float> a(64, 1.0f);
  const MatrixPart part{a.data(), DType::kF32, 4};
  Result<PackedMatrix> w = PackedMatrix::Pack(std::span<const MatrixPart>(&part, 1), 16);
  ASSERT_TRUE(w.ok());
  std::vector<float> x(64), y(64);
  MatmulParams p;
  p.x = x.data();
  p.m = 2;
  p.ldx = 16;
  p.w = &*w;
  p.y = y.data();
  p.ldy = 4;
  EXPECT_TRUE(CheckMatmulParams(p).ok());
  auto check = [&](MatmulParams q, const char* needle) {
    const Status s = CheckMatmulParams(q);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  MatmulParams q = p;
  q.w = nullptr;
  check(q, "w is null");
  q = p;
  q.m = -1;
  check(q, "m = -1");
  q = p;
  q.x = nullptr;
  check(q, "x is null");
  q = p;
  q.y = nullptr;
  check(q, "y is null");
  q = p;
  q.ldx = 15;
  check(q, "ldx = 15 < K = 16");
  q = p;
  q.ldy = 3;
  check(q, "ldy = 3 < N = 4");
  q = p;
  q.m = 0;
  q.x = nullptr;
  EXPECT_TRUE(CheckMatmulParams(q).ok());  // nothing to compute
}

// F16 and BF16 source parts (widened exactly) through every ISA and both storages.
TEST(MatmulTest, MixedDtypePartsEqualReference) {
  const int64_t k = 37, m = 9;
  std::mt19937 rng(61);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> p0(20 * k);
  std::vector<uint16_t> p1(7 * k), p2(13 * k);
  for (float& v : p0) v = dist(rng);
  for (uint16_t& h : p1) {  // finite halves
    h = static_cast<uint16_t>(rng() & 0xFFFF);
    if ((h & 0x7C00) == 0x7C00) h &= 0xBFFF;
  }
  for (uint16_t& h : p2) h = F32ToBf16(dist(rng));
  const MatrixPart parts[] = {
      {p0.data(), DType::kF32, 20}, {p1.data(), DType::kF16, 7}, {p2.data(), DType::kBF16, 13}};
  const std::vector<float> x = RandomFloats(static_cast<size_t>(m * k), 62);
  const std::vector<float> bias = RandomFloats(40, 63);
  ThreadPool pool(3);
  for (DType storage : {DType::kF32, DType::kBF16}) {
    Result<PackedMatrix> pm = PackedMatrix::Pack(parts, k, storage);
    ASSERT_TRUE(pm.ok());
    ASSERT_EQ(pm->n(), 40);
    std::vector<float> w_unpacked(static_cast<size_t>(40 * k));
    for (int64_t r = 0; r < 40; ++r) pm->UnpackRow(r, &w_unpacked[r * k]);
    std::vector<float> want(static_cast<size_t>(m * 40));
    MatmulReference(x.data(), m, w_unpacked.data(), 40, k, bias.data(), want.data());
    for (Isa isa : SupportedIsas()) {
      for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const std::vector<float> got = RunMatmul(isa, x, m, k, *pm, bias.data(), tp);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
            << IsaName(isa) << " bf16=" << (storage == DType::kBF16);
      }
    }
  }
}

TEST(MatmulTest, PackRejectsBadInput) {
  const std::vector<float> a(64, 1.0f);
  const MatrixPart good{a.data(), DType::kF32, 4};
  auto code = [](Result<PackedMatrix> r) { return r.ok() ? ErrorCode::kOk : r.status().code(); };
  EXPECT_EQ(code(PackedMatrix::Pack(std::span<const MatrixPart>(&good, 1), 0)),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(PackedMatrix::Pack(std::span<const MatrixPart>(&good, 1), -3)),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(PackedMatrix::Pack(std::span<const MatrixPart>(), 16)),
            ErrorCode::kInvalidArgument);
  const MatrixPart null_part[] = {good, {nullptr, DType::kF32, 4}};
  EXPECT_EQ(code(PackedMatrix::Pack(null_part, 16)), ErrorCode::kInvalidArgument);
  const MatrixPart zero_rows[] = {good, {a.data(), DType::kF32, 0}};
  EXPECT_EQ(code(PackedMatrix::Pack(zero_rows, 16)), ErrorCode::kInvalidArgument);
  const MatrixPart neg_rows[] = {{a.data(), DType::kF32, -1}};
  EXPECT_EQ(code(PackedMatrix::Pack(neg_rows, 16)), ErrorCode::kInvalidArgument);
  const MatrixPart bad_dtype[] = {{a.data(), static_cast<DType>(7), 4}};
  EXPECT_EQ(code(PackedMatrix::Pack(bad_dtype, 16)), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(PackedMatrix::Pack(std::span<const MatrixPart>(&good, 1), 16, DType::kF16)),
            ErrorCode::kInvalidArgument);
  const MatrixPart huge[] = {{a.data(), DType::kF32, int64_t{1} << 40}};
  EXPECT_EQ(code(PackedMatrix::Pack(huge, 16)), ErrorCode::kInvalidArgument);
  const MatrixPart wide[] = {{a.data(), DType::kF32, 1 << 20}};
  EXPECT_EQ(code(PackedMatrix::Pack(wide, int64_t{1} << 40)), ErrorCode::kInvalidArgument);
  // And the good one packs.
  EXPECT_EQ(code(PackedMatrix::Pack(std::span<const MatrixPart>(&good, 1), 16)), ErrorCode::kOk);
  Result<PackedMatrix> r = PackedMatrix::Pack(std::span<const MatrixPart>(&good, 1), 0);
  EXPECT_NE(r.status().message().find("k must be > 0"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace bitroll::kernels
