// Sibling groups of a decode call (attention.h): which rows of different sequences read the same
// leading blocks, and which of them are worth walking together. Scheduling only: a row's bits do
// not depend on its group.
#include <algorithm>
#include <limits>

#include "kernels/cpu/attention_internal.h"

namespace bitroll::kernels::internal {
namespace {

// Blocks a row at `position` reads: its table's length.
inline int32_t TableBlocks(const AttentionParams& p, int32_t row) {
  return p.positions[row] / p.block_size + 1;
}

// The leading blocks that are the same block ids in every row's table (within every table).
int32_t CommonBlocks(const AttentionParams& p, const int32_t* rows, int32_t n) {
  int32_t blocks = std::numeric_limits<int32_t>::max();
  for (int32_t i = 0; i < n; ++i) blocks = std::min(blocks, TableBlocks(p, rows[i]));
  const int32_t* first = p.block_tables[rows[0]];
  for (int32_t b = 0; b < blocks; ++b) {
    for (int32_t i = 1; i < n; ++i) {
      if (p.block_tables[rows[i]][b] != first[b]) return b;
    }
  }
  return blocks;
}

// Of the rows rows[0 .. n), the leading chunks that every row reads from the same block ids and
// that hold only keys at or before every row's position: what they share.
int32_t SharedChunks(const AttentionParams& p, const int32_t* rows, int32_t n) {
  int32_t shared = std::numeric_limits<int32_t>::max();
  for (int32_t i = 0; i < n; ++i) {
    shared = std::min(shared, (p.positions[rows[i]] + 1) / kAttentionChunk);
  }
  const int32_t per_block = p.block_size / kAttentionChunk;
  return std::min(shared, CommonBlocks(p, rows, n) * per_block);
}

struct Planner {
  const AttentionParams& p;
  int32_t max_rows;
  std::vector<int32_t>* pending;  // rows that share only their parent's blocks, stacked per level
  AttentionScratch::SiblingGroups* out;

  // Rows rows[0 .. n) become groups of at most max_rows when the chunks they share save at least
  // a twelfth of their chunk reads (a group walks its rows' own chunks head by head, a little
  // slower than a lone row's adjacent heads; docs/benchmarks.md, issue 19 round 6).
  void Emit(const int32_t* rows, int32_t n) {
    if (n < 2) return;
    int64_t reads = 0;
    for (int32_t i = 0; i < n; ++i) reads += p.positions[rows[i]] / kAttentionChunk + 1;
    const int64_t saved = int64_t{n - 1} * SharedChunks(p, rows, n);
    if (saved == 0 || 12 * saved < reads) return;
    const int32_t groups = (n + max_rows - 1) / max_rows;
    for (int32_t g = 0; g < groups; ++g) {  // cut evenly
      const int32_t* first = rows + g * n / groups;
      const int32_t* end = rows + (g + 1) * n / groups;
      out->begin.push_back(static_cast<int32_t>(out->rows.size()));
      out->shared.push_back(SharedChunks(p, first, static_cast<int32_t>(end - first)));
      out->rows.insert(out->rows.end(), first, end);
    }
  }

  // Rows rows[0 .. n) share at least their first block. Rows that share more among themselves
  // (the samples of one prompt under a system prompt common to all) group on their own; the rest
  // group on what they all share.
  void Plan(int32_t* rows, int32_t n) {
    if (n < 2) return;
    const int32_t b = CommonBlocks(p, rows, n);
    auto key = [&](int32_t row) { return b < TableBlocks(p, row) ? p.block_tables[row][b] : -1; };
    std::stable_sort(rows, rows + n, [&](int32_t x, int32_t y) { return key(x) < key(y); });
    const size_t base = pending->size();
    for (int32_t i = 0; i < n;) {
      int32_t j = i + 1;
      while (j < n && key(rows[j]) == key(rows[i])) ++j;
      if (j - i == 1) {
        pending->push_back(rows[i]);
      } else if (j - i == n) {  // no row diverges at b (tables that end there): one group
        Emit(rows, n);
      } else {
        Plan(rows + i, j - i);
      }
      i = j;
    }
    Emit(pending->data() + base, static_cast<int32_t>(pending->size() - base));
    pending->resize(base);
  }
};

}  // namespace

void PlanSiblingGroups(const AttentionParams& p, const std::vector<int32_t>& alone,
                       int32_t max_rows, AttentionScratch::SiblingGroups* out) {
  out->rows.clear();
  out->begin.clear();
  out->shared.clear();
  out->work.assign(alone.begin(), alone.end());
  std::stable_sort(out->work.begin(), out->work.end(), [&](int32_t x, int32_t y) {
    return p.block_tables[x][0] < p.block_tables[y][0];
  });
  Planner planner{p, max_rows, &out->pending, out};
  for (size_t i = 0; i < out->work.size();) {
    size_t j = i + 1;
    while (j < out->work.size() &&
           p.block_tables[out->work[j]][0] == p.block_tables[out->work[i]][0]) {
      ++j;
    }
    planner.Plan(out->work.data() + i, static_cast<int32_t>(j - i));
    i = j;
  }
  out->begin.push_back(static_cast<int32_t>(out->rows.size()));
}

}  // namespace bitroll::kernels::internal
