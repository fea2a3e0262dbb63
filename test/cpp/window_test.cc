// Windowed factors (rule.h) and the window geometry of convolution/pooling (rules/window.h):
// halo formulas checked against a brute-force enumeration of which rows each output row reads,
// and AssignFactors' even-tiling rule for windowed factors.
#include "partition/rules/window.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "partition/factor_assignment.h"

namespace spmd::partition {
namespace {

Window Make(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, int64_t pad) {
  Window w;
  w.in = in;
  w.kernel = kernel;
  w.stride = stride;
  w.dilation = dilation;
  w.pad = pad;
  w.out = (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
  return w;
}

// Output rows the local op yields for `rows` input rows with padding `pad` on both sides.
int64_t LocalOut(const Window& w, int64_t rows, int64_t pad) {
  int64_t room = rows + 2 * pad - w.Span();
  return room < 0 ? 0 : room / w.stride + 1;
}

TEST(WindowTest, SameConvolutionsAndPoolingsAreTileable) {
  EXPECT_TRUE(Make(16, 3, 1, 1, 1).Tileable());   // 3x3 'same'
  EXPECT_TRUE(Make(16, 3, 2, 1, 1).Tileable());   // 3x3 stride 2
  EXPECT_TRUE(Make(16, 3, 1, 2, 2).Tileable());   // dilated 'same'
  EXPECT_TRUE(Make(16, 2, 2, 1, 0).Tileable());   // 2x2 pooling
  EXPECT_TRUE(Make(16, 1, 2, 1, 0).Tileable());   // strided 1x1 (negative right halo)
  EXPECT_FALSE(Make(16, 3, 1, 1, 0).Tileable());  // 'valid': halos grow with the tile index
  EXPECT_FALSE(Make(16, 3, 2, 1, 0).Tileable());
  EXPECT_FALSE(Make(15, 2, 2, 1, 0).Tileable());  // odd extent under stride 2
  Window w = Make(16, 5, 1, 1, 2);
  EXPECT_EQ(w.Left(), 2);
  EXPECT_EQ(w.Right(), 2);
  EXPECT_EQ(w.MaxTiles(), 8);                     // tiles of at least 2 rows
  EXPECT_EQ(Make(16, 2, 2, 1, 0).MaxTiles(), 0);  // no halo: no limit
}

// For every tileable geometry and tiling: (1) the rows each tile's outputs read lie within its
// halos, with padding exactly where the halo passes the ends; (2) the local op on the extended
// tile with no padding yields exactly the tile's outputs; (3) GradHalo's grad_output rows
// cover every output row that reads the tile, and the local backward's geometry lines up.
TEST(WindowTest, HalosMatchBruteForce) {
  int checked = 0, grad_checked = 0;
  for (int64_t in : {8, 12, 16, 24})
    for (int64_t k = 1; k <= 5; ++k)
      for (int64_t s = 1; s <= 3; ++s)
        for (int64_t d = 1; d <= 2; ++d)
          for (int64_t p = 0; p <= 3; ++p) {
            Window w = Make(in, k, s, d, p);
            if (!w.Tileable()) continue;
            for (int64_t tiles : {1, 2, 4}) {
              if (in % tiles || w.out % tiles) continue;
              if (w.MaxTiles() > 0 && tiles > w.MaxTiles()) continue;
              const int64_t li = in / tiles, oi = w.out / tiles;
              for (int64_t i = 0; i < tiles; ++i) {
                int64_t lo = i * li - w.Left(), hi = (i + 1) * li + w.Right();  // [lo, hi)
                for (int64_t j = i * oi; j < (i + 1) * oi; ++j)
                  for (int64_t t = 0; t < k; ++t) {
                    int64_t r = j * s - p + d * t;
                    ASSERT_TRUE(r >= lo && r < hi) << "in=" << in << " k=" << k << " s=" << s
                                                   << " d=" << d << " p=" << p << " tile " << i;
                  }
                ASSERT_EQ(LocalOut(w, li + w.Left() + w.Right(), 0), oi)
                    << "in=" << in << " k=" << k << " s=" << s << " d=" << d << " p=" << p;
              }
              int64_t gl, gr, lpad;
              const bool grad_halo = w.GradHalo(tiles, &gl, &gr, &lpad);
              if (s == 1) {
                ASSERT_TRUE(grad_halo);  // its halos are the forward's, mirrored
              }
              if (!grad_halo) continue;
              ++grad_checked;
              ASSERT_EQ(LocalOut(w, li, lpad), oi + gl + gr);
              for (int64_t i = 0; i < tiles; ++i)
                for (int64_t j = 0; j < w.out; ++j)
                  for (int64_t t = 0; t < k; ++t) {
                    int64_t r = j * s - p + d * t;
                    if (r < i * li || r >= (i + 1) * li) continue;
                    // Output row j reaches the tile: it is in the grad halo, and the local
                    // backward maps it (local row j - (i*oi - gl)) onto local input row r - i*li.
                    ASSERT_TRUE(j >= i * oi - gl && j < (i + 1) * oi + gr);
                    ASSERT_EQ((j - (i * oi - gl)) * s - lpad + d * t, r - i * li);
                  }
              ++checked;
            }
          }
  EXPECT_GT(checked, 50);
  EXPECT_EQ(grad_checked, checked);  // GradHalo finds halos for all of these
}

MeshPtr Mesh42() {
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  return std::make_shared<const Mesh>(ids, std::vector<int64_t>{4, 2},
                                      std::vector<std::string>{"data", "model"});
}

// A pooling-like rule: [n, h] -> [n, h'] with h windowed (input extent `in`, output `out`).
ShardingRule PoolRule(int64_t in, int64_t out, int64_t max_tiles) {
  ShardingRule rule;
  int n = rule.AddFactor(2);
  int h = rule.AddFactor(out);
  rule.factors[h].windowed = true;
  rule.factors[h].max_tiles = max_tiles;
  rule.operands = {{{n}, {h}}};
  rule.results = {{{n}, {h}}};
  return rule;
}

AxisList AssignH(const ShardingRule& rule, const MeshPtr& mesh, const TensorType& in,
                 const TensorType& out, const AxisList& input_axes) {
  Sharding s = Sharding::Tiled(mesh, {{}, input_axes});
  return AssignFactors(rule, *mesh, {&s}, {in}, {nullptr}, {out})[1];
}

TEST(WindowedFactorTest, ShardedOnlyIntoEvenTilesWithinMaxTiles) {
  MeshPtr mesh = Mesh42();
  TensorType in{DType::kFloat32, {2, 16}}, out{DType::kFloat32, {2, 8}};
  // Both axes (8 tiles) divide 16 and 8.
  EXPECT_EQ(AssignH(PoolRule(16, 8, 0), mesh, in, out, {0, 1}), (AxisList{0, 1}));
  // At most 4 tiles: the longest prefix that fits.
  EXPECT_EQ(AssignH(PoolRule(16, 8, 4), mesh, in, out, {0, 1}), (AxisList{0}));
  // 6 output rows: 4 tiles do not divide them, 2 do.
  TensorType out6{DType::kFloat32, {2, 6}}, in12{DType::kFloat32, {2, 12}};
  EXPECT_EQ(AssignH(PoolRule(12, 6, 0), mesh, in12, out6, {0}), (AxisList{}));
  EXPECT_EQ(AssignH(PoolRule(12, 6, 0), mesh, in12, out6, {1}), (AxisList{1}));
  // An ordinary pass-through factor ignores evenness.
  ShardingRule plain = PoolRule(12, 6, 0);
  plain.factors[1].windowed = false;
  EXPECT_EQ(AssignH(plain, mesh, in12, out6, {0}), (AxisList{0}));
}

}  // namespace
}  // namespace spmd::partition
