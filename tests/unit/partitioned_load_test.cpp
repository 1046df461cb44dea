// load/read_planning: partitioned load planning, run for W ranks in one
// process with the messages moved by hand, against the planner every rank
// ran before (make_load_schedule over every rank's needs, kept here as the
// reference) on random meshes: each rank reads the same pieces itself, shares
// the same pieces with the same needers, slabs and hosts; every shared piece
// is read once, by one of its needers (a scheduler balances its own pieces,
// so the reader may differ from the reference's); given those readers, the
// reference makes exactly the same transfers; both ends of every transfer
// agree on its window and tag; and every need reaches one scheduler.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <tuple>

#include "distckpt/core/errors.h"
#include "load/read_planning.h"
#include "plan/load_share.h"
#include "plan/messages.h"
#include "support/all_to_all.h"

namespace distckpt::loading {
namespace {

using testing::Messages;
using testing::transpose;

// Tensors of random shapes, each stored as a grid of row and column blocks.
struct Catalog {
  std::vector<Shape> shapes;
  std::vector<std::vector<Box>> pieces;  // per tensor
  PieceCatalog view() const {
    PieceCatalog c;
    c.lookup = [this](uint32_t t, uint32_t p) {
      if (t >= pieces.size() || p >= pieces[t].size()) throw ProtocolError("no such piece");
      return plan::PieceGeometry{pieces[t][p], 2, {}};
    };
    c.check = [this](const std::vector<plan::PieceNeed>& needs, int) {
      for (const plan::PieceNeed& n : needs) ASSERT_TRUE(contains(pieces.at(n.tensor).at(n.piece), n.part));
    };
    return c;
  }
};

Catalog random_catalog(std::mt19937& rng) {
  Catalog c;
  const int tensors = std::uniform_int_distribution<int>(1, 6)(rng);
  for (int t = 0; t < tensors; ++t) {
    const int64_t rows = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int64_t cols = std::uniform_int_distribution<int64_t>(1, 24)(rng);
    const int64_t row_blocks = std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(rows, 4))(rng);
    const int64_t col_blocks = std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(cols, 3))(rng);
    c.shapes.push_back({rows, cols});
    c.pieces.emplace_back();
    for (int64_t i = 0; i < row_blocks; ++i) {
      for (int64_t j = 0; j < col_blocks; ++j) {
        const int64_t r0 = rows * i / row_blocks, r1 = rows * (i + 1) / row_blocks;
        const int64_t c0 = cols * j / col_blocks, c1 = cols * (j + 1) / col_blocks;
        c.pieces.back().push_back(Box{{r0, c0}, {r1 - r0, c1 - c0}});
      }
    }
  }
  return c;
}

// A random mesh: ranks in data-parallel groups request the same boxes (a
// tensor-parallel split along a random axis), some ranks a random box of
// their own, some nothing of a tensor.
std::vector<std::vector<plan::PieceNeed>> random_needs(const Catalog& c, int world, std::mt19937& rng) {
  std::vector<std::vector<plan::PieceNeed>> needs(static_cast<size_t>(world));
  for (uint32_t t = 0; t < c.shapes.size(); ++t) {
    const Shape& shape = c.shapes[t];
    const int tp = std::uniform_int_distribution<int>(1, 4)(rng);
    const size_t axis = std::uniform_int_distribution<size_t>(0, 1)(rng);
    for (int r = 0; r < world; ++r) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind == 0) continue;
      Box want{{0, 0}, shape};
      if (kind == 1) {
        for (size_t d = 0; d < 2; ++d) {
          want.offset[d] = std::uniform_int_distribution<int64_t>(0, shape[d] - 1)(rng);
          want.length[d] = std::uniform_int_distribution<int64_t>(1, shape[d] - want.offset[d])(rng);
        }
      } else if (shape[axis] >= tp) {
        const int64_t k = r % tp;
        want.offset[axis] = shape[axis] * k / tp;
        want.length[axis] = shape[axis] * (k + 1) / tp - want.offset[axis];
      }
      for (uint32_t p = 0; p < c.pieces[t].size(); ++p) {
        if (const auto part = intersect(c.pieces[t][p], want)) needs[static_cast<size_t>(r)].push_back({t, p, *part});
      }
    }
  }
  return needs;
}

std::vector<std::vector<TensorRead>> as_rounds(const std::vector<plan::PieceNeed>& needs) {
  std::vector<TensorRead> reads;
  for (const plan::PieceNeed& n : needs) reads.push_back(TensorRead{n, at::Tensor()});
  return {reads};
}

struct Partitioned {
  std::vector<plan::LoadShare> shares;  // per rank
  std::vector<size_t> routed_needs;     // per scheduler: needs routed to it
};

Partitioned plan_partitioned(const Catalog& c, const std::vector<std::vector<plan::PieceNeed>>& needs,
                             const std::vector<std::string>& hosts, uint64_t batch) {
  const int world = static_cast<int>(needs.size());
  const PieceCatalog view = c.view();
  ReadEngineOptions options;
  options.exchange = LoadExchange::kAuto;
  options.slab_bytes = batch;
  Messages routes(needs.size());
  for (int r = 0; r < world; ++r) {
    routes[static_cast<size_t>(r)] = route_read_plan(as_rounds(needs[static_cast<size_t>(r)]), r, world, hosts[r]);
  }
  const Messages routed = transpose(routes);
  Partitioned out;
  Messages decisions(needs.size());
  for (int s = 0; s < world; ++s) {
    decisions[static_cast<size_t>(s)] = schedule_routed_needs(view, routed[static_cast<size_t>(s)], options, s);
  }
  const Messages told = transpose(decisions);
  for (int r = 0; r < world; ++r) {
    std::vector<plan::LoadShare> shares;
    std::vector<bool> within_host;
    EXPECT_EQ(merge_shares(view, told[static_cast<size_t>(r)], {needs[static_cast<size_t>(r)]}, r, shares, within_host),
              1u);
    out.shares.push_back(std::move(shares.at(0)));
  }
  for (int s = 0; s < world; ++s) {  // what each scheduler was sent, decoded
    size_t count = 0;
    for (const std::string& m : routed[static_cast<size_t>(s)]) {
      for (const std::string_view round : plan::decode_read_plan(m, "test").rounds) {
        if (round.empty()) continue;
        for (const plan::PieceNeed& n : plan::decode_needs(std::string(round), "test")) {
          EXPECT_EQ(scheduler_of(n.tensor, n.piece, world), s);
          ++count;
        }
      }
    }
    out.routed_needs.push_back(count);
  }
  return out;
}

// A rank's view of one shared piece, reader aside.
using PieceView = std::tuple<uint32_t, uint32_t, bool, std::vector<std::pair<int64_t, int64_t>>, std::set<uint32_t>>;

PieceView view_of(const plan::SharePiece& p) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const Box& s : p.slabs) rows.emplace_back(s.ndim() ? s.offset[0] : 0, s.ndim() ? s.length[0] : 1);
  return {p.tensor, p.piece, p.same_host, rows, std::set<uint32_t>(p.own_needs.begin(), p.own_needs.end())};
}

// What a rank sends and receives: (from, to, tensor, piece, slab, bytes), counted.
std::map<std::tuple<int, int, uint32_t, uint32_t, uint32_t, uint64_t>, int> transfers_of(const plan::LoadShare& share) {
  std::map<std::tuple<int, int, uint32_t, uint32_t, uint32_t, uint64_t>, int> out;
  for (const plan::ShareTransfer& t : share.transfers) {
    const plan::SharePiece& p = share.pieces[t.piece];
    ++out[{t.from, t.to, p.tensor, p.piece, t.slab, t.bytes}];
  }
  return out;
}

TEST(PartitionedLoadPlanning, MatchesTheGlobalPlannerOnRandomMeshes) {
  std::mt19937 rng(20261129);
  size_t shared_pieces = 0, within_host = 0, messages = 0;  // what the trials covered
  for (int trial = 0; trial < 150; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const Catalog c = random_catalog(rng);
    const int world = std::uniform_int_distribution<int>(2, 12)(rng);
    const auto needs = random_needs(c, world, rng);
    const int host_count = std::uniform_int_distribution<int>(1, 3)(rng);
    std::vector<std::string> hosts;
    std::vector<int> host_of;
    for (int r = 0; r < world; ++r) {
      host_of.push_back(r * host_count / world);
      hosts.push_back("node-" + std::to_string(host_of.back()));
    }
    const uint64_t batch = std::uniform_int_distribution<uint64_t>(16, 400)(rng);

    const Partitioned part = plan_partitioned(c, needs, hosts, batch);
    plan::LoadSchedule global = plan::make_load_schedule(needs, c.view().lookup, batch, true, host_of);
    std::vector<int> ranks(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) ranks[static_cast<size_t>(r)] = r;
    const auto reference_shares = [&] {
      std::vector<plan::TransferKey> keys(plan::slab_transfers(global, needs).size());
      return plan::shares_of(global, needs, ranks, keys);
    };
    const std::vector<plan::LoadShare> reference = reference_shares();
    // The partitioned readers, put into the reference.
    std::map<std::tuple<uint32_t, uint32_t>, int> reader_of;
    for (int r = 0; r < world; ++r) {
      for (const plan::SharePiece& p : part.shares[static_cast<size_t>(r)].pieces)
        reader_of[{p.tensor, p.piece}] = p.reader;
    }
    for (plan::SharedPiece& s : global.shared) s.reader = reader_of.at({s.tensor, s.piece});
    const std::vector<plan::LoadShare> same_readers = reference_shares();

    std::map<std::tuple<uint32_t, uint32_t>, int> read_by;  // shared piece -> times a rank reads it
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const plan::LoadShare& mine = part.shares[static_cast<size_t>(r)];
      const plan::LoadShare& ref = reference[static_cast<size_t>(r)];
      // The same needs read by the rank itself; the same shared pieces, needers' parts aside.
      std::vector<bool> own(mine.slot.size()), ref_own(ref.slot.size());
      for (size_t i = 0; i < own.size(); ++i) own[i] = mine.slot[i] < 0;
      for (size_t i = 0; i < ref_own.size(); ++i) ref_own[i] = ref.slot[i] < 0;
      EXPECT_EQ(own, ref_own);
      std::set<PieceView> views, ref_views;
      for (const plan::SharePiece& p : mine.pieces) views.insert(view_of(p));
      for (const plan::SharePiece& p : ref.pieces) ref_views.insert(view_of(p));
      EXPECT_EQ(views, ref_views);
      EXPECT_EQ(transfers_of(mine), transfers_of(same_readers[static_cast<size_t>(r)]));
      for (const plan::SharePiece& p : mine.pieces) {
        if (p.reader == r) {
          ++read_by[{p.tensor, p.piece}];
          EXPECT_FALSE(p.others.empty());
        }
      }
      for (size_t k = 1; k < mine.transfers.size(); ++k) {
        EXPECT_LE(std::tie(mine.transfers[k - 1].window, mine.transfers[k - 1].tag),
                  std::tie(mine.transfers[k].window, mine.transfers[k].tag));
      }
    }
    std::set<std::tuple<uint32_t, uint32_t>> shared;
    for (const plan::SharedPiece& s : global.shared) {
      shared.insert({s.tensor, s.piece});
      within_host += s.same_host ? 1 : 0;
    }
    shared_pieces += shared.size();
    for (const plan::LoadShare& share : part.shares) messages += share.transfers.size();
    EXPECT_EQ(read_by.size(), shared.size());
    for (const auto& [piece, times] : read_by) {
      EXPECT_EQ(times, 1) << "piece " << std::get<1>(piece) << " of tensor " << std::get<0>(piece);
    }

    // Both ends of each transfer hold it with the same window and tag; a window moves at most the batch.
    std::map<std::tuple<uint64_t, uint32_t>, std::vector<std::tuple<int, int, uint32_t, uint32_t, uint32_t, uint64_t>>>
        ends;
    for (int r = 0; r < world; ++r) {
      const plan::LoadShare& mine = part.shares[static_cast<size_t>(r)];
      for (const plan::ShareTransfer& t : mine.transfers) {
        const plan::SharePiece& p = mine.pieces[t.piece];
        ends[{t.window, t.tag}].emplace_back(t.from, t.to, p.tensor, p.piece, t.slab, t.bytes);
      }
    }
    std::map<uint64_t, uint64_t> moved;
    for (const auto& [key, seen] : ends) {
      const auto& [from, to, tensor, piece, slab, bytes] = seen[0];
      ASSERT_EQ(seen.size(), from == to ? 1u : 2u);
      EXPECT_EQ(seen.front(), seen.back());
      if (from != to) moved[std::get<0>(key)] += bytes + 8;
    }
    for (const auto& [window, bytes] : moved) {
      size_t count = 0;
      for (const auto& [key, seen] : ends)
        count += std::get<0>(key) == window && std::get<0>(seen[0]) != std::get<1>(seen[0]);
      if (count > 1) {
        EXPECT_LE(bytes, batch) << "window " << window;
      }
    }
  }
  EXPECT_GT(shared_pieces, 500u);
  EXPECT_GT(within_host, 100u);
  EXPECT_GT(messages, 1000u);
}

TEST(PartitionedLoadPlanning, EveryNeedReachesItsPiecesSchedulerOnly) {
  std::mt19937 rng(7);
  const Catalog c = random_catalog(rng);
  const int world = 9;
  const auto needs = random_needs(c, world, rng);
  const Partitioned part = plan_partitioned(c, needs, std::vector<std::string>(world, "node"), 64);
  size_t total = 0, routed = 0;
  for (const auto& n : needs) total += n.size();
  for (const size_t n : part.routed_needs) routed += n;
  EXPECT_EQ(routed, total) << "every need goes to exactly one scheduler";
}

// A rank takes from each scheduler only shares of the pieces it schedules,
// in windows of its own.
TEST(PartitionedLoadPlanning, ARankRefusesASharePassedOffAsAnotherSchedulers) {
  std::mt19937 rng(3);
  const Catalog c = random_catalog(rng);
  const int world = 5;
  std::vector<std::vector<plan::PieceNeed>> needs(world);
  for (int r = 0; r < world; ++r) {
    for (uint32_t p = 0; p < c.pieces[0].size(); ++p) needs[static_cast<size_t>(r)].push_back({0, p, c.pieces[0][p]});
  }
  const PieceCatalog view = c.view();
  ReadEngineOptions options;
  Messages routes;
  for (int r = 0; r < world; ++r)
    routes.push_back(route_read_plan(as_rounds(needs[static_cast<size_t>(r)]), r, world, ""));
  const Messages routed = transpose(routes);
  Messages decisions;
  for (int s = 0; s < world; ++s)
    decisions.push_back(schedule_routed_needs(view, routed[static_cast<size_t>(s)], options, s));
  std::vector<std::string> told = transpose(decisions)[0];
  const int from = scheduler_of(0, 0, world), to = (from + 1) % world;
  std::swap(told[static_cast<size_t>(from)], told[static_cast<size_t>(to)]);
  std::vector<plan::LoadShare> shares;
  std::vector<bool> within_host;
  try {
    merge_shares(view, told, {needs[0]}, 0, shares, within_host);
    FAIL() << "no error";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("which it does not schedule"), std::string::npos) << e.what();
  }
}

TEST(PartitionedLoadPlanning, ASchedulerRefusesANeedOfAPieceItDoesNotSchedule) {
  Catalog c;
  c.shapes = {{8, 8}};
  c.pieces = {{Box{{0, 0}, {4, 8}}, Box{{4, 0}, {4, 8}}}};
  const int world = 4;
  const plan::PieceNeed need{0, 0, Box{{0, 0}, {4, 8}}};
  const int owner = scheduler_of(0, 0, world);
  const int other = (owner + 1) % world;
  std::vector<std::string> routed(world);
  for (int r = 0; r < world; ++r) {
    // Rank 0 sends the need to the wrong scheduler.
    const auto parts = route_read_plan(
        as_rounds(r == 0 ? std::vector<plan::PieceNeed>{need} : std::vector<plan::PieceNeed>{}), r, world, "");
    routed[static_cast<size_t>(r)] = parts[static_cast<size_t>(r == 0 ? owner : other)];
  }
  ReadEngineOptions options;
  try {
    schedule_routed_needs(c.view(), routed, options, other);
    FAIL() << "no error";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("not its scheduler"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distckpt::loading
