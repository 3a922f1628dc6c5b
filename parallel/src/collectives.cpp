// The collectives over messages (ring_allreduce.hpp, reduce_scatter.hpp,
// all_gather.hpp, broadcast.hpp). Two engines, chosen by the group's
// message_algorithm, each a reduce-scatter and/or an all-gather, chunk by
// chunk: the ring, and recursive halving then doubling. Both leave segment
// r (ring_segment) reduced on rank r, so either can serve reduce_scatter.
#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include <fmt/format.h>

#include "troupe/parallel/collectives.hpp"

#include "reducer_member.hpp"
#include "same_host_workspace.hpp"

namespace troupe::parallel {

ring_range ring_segment(std::int64_t count, std::uint32_t n, std::uint32_t k) {
  const std::int64_t base = count / n;
  const std::int64_t extra = count % n;
  const std::int64_t begin = k * base + std::min<std::int64_t>(k, extra);
  return {begin, begin + base + (static_cast<std::int64_t>(k) < extra ? 1 : 0)};
}

namespace {

/// Chunk c of segment `seg`: every rank cuts every segment into the same
/// number of chunks, so both ends of a link agree on ranges without asking.
struct layout {
  std::int64_t count;
  std::uint32_t n;
  std::uint32_t chunks;

  /// Chunks of at most `chunk_elems`; and, while chunks stay at least
  /// `min_elems` long, at least `min_chunks` per segment, so that a segment
  /// smaller than a chunk is still pipelined.
  layout(std::int64_t count_, std::uint32_t n_, std::int64_t chunk_elems, std::int64_t min_elems,
         std::uint32_t min_chunks)
      : count(count_), n(n_) {
    const auto longest = (count + n - 1) / n;
    auto by_size = std::max<std::int64_t>(1, (longest + chunk_elems - 1) / chunk_elems);
    auto by_count = std::min<std::int64_t>(min_chunks, longest / std::max<std::int64_t>(min_elems, 1));
    chunks = static_cast<std::uint32_t>(std::max<std::int64_t>({by_size, by_count, 1}));
  }
  ring_range chunk(std::uint32_t seg, std::uint32_t c) const {
    auto s = ring_segment(count, n, seg);
    auto len = s.end - s.begin;
    return {s.begin + len * c / chunks, s.begin + len * (c + 1) / chunks};
  }
};

std::uint32_t mod(std::int64_t x, std::uint32_t n) {
  auto m = x % static_cast<std::int64_t>(n);
  return static_cast<std::uint32_t>(m < 0 ? m + n : m);
}

expected<void> check(const tensor& t, const char* what) {
  if (!t.defined() || !t.is_contiguous() || t.where() != device::cpu())
    return make_error(errc::invalid_argument, "{}: the tensor must be a defined, contiguous CPU tensor", what);
  if (t.type() != dtype::float32 && t.type() != dtype::float64)
    return make_error(errc::unsupported_dtype, "{}: float32 or float64 only", what);
  return {};
}

/// A copy of data[0, n) to send to rank `to` (in the shared arena when it
/// pays: reducer_group::chunk_buffer).
template <class T> tensor copy_of(reducer_member& g, std::uint32_t to, const T* data, std::int64_t n) {
  auto out = g.chunk_buffer(to, dtype_of<T>::value, n);
  std::memcpy(out.template data<T>(), data, static_cast<std::size_t>(n) * sizeof(T));
  return out;
}

/// Sends a copy of base[range] to rank `to` as chunk `c` of `step`; an
/// empty range (count < n) is skipped by both ends.
template <class T>
expected<void> send_chunk(reducer_member& g, std::uint32_t to, std::uint64_t id, std::uint32_t step,
                          std::uint32_t c, const T* base, ring_range range) {
  if (range.begin == range.end)
    return {};
  return g.send_to(to, id, step, c, copy_of(g, to, base + range.begin, range.end - range.begin));
}

/// Waits for chunk `c` of `step` from rank `from`, which must hold exactly
/// the elements of `range` (it comes from another process).
template <class T>
expected<tensor> receive_chunk(reducer_member& g, std::uint32_t from, std::uint64_t id, std::uint32_t step,
                               std::uint32_t c, ring_range range) {
  auto got = g.receive(from, id, step, c);
  if (!got)
    return got;
  if (got->numel() != range.end - range.begin || got->type() != dtype_of<T>::value)
    return make_error(errc::malformed_message,
                      "reducer{}: chunk {} of step {} from {} has {} elements of {}, want {} of {}", g.rank(), c,
                      step, g.describe(from), got->numel(), got->type(), range.end - range.begin, dtype_of<T>::value);
  return got;
}

/// dst = src + dst (divided by n when averaging: the same two operations as
/// before, so results do not change by a bit), also written to `also` when
/// given.
template <class T> void final_sum(T* dst, const T* src, std::int64_t len, bool average, T n, T* also) {
  // One loop per case, the branches outside: a loop with them inside stays
  // scalar (GCC 12 does not unswitch at -O2).
  auto loop = [&](auto averaged, auto copied) {
    for (std::int64_t i = 0; i < len; ++i) {
      T v = src[i] + dst[i];
      if constexpr (averaged)
        v = v / n;
      dst[i] = v;
      if constexpr (copied)
        also[i] = v;
    }
  };
  using yes = std::true_type;
  using no = std::false_type;
  if (average)
    also ? loop(yes{}, yes{}) : loop(yes{}, no{});
  else
    also ? loop(no{}, yes{}) : loop(no{}, no{});
}

/// Runs the ring over the flat buffer `base[0, count)`. Ring steps are
/// numbered 0..N-2 for reduce-scatter and N..2N-2 for all-gather.
template <class T>
expected<void> ring(reducer_member& g, T* base, std::int64_t count, std::uint64_t id, bool reduce, bool gather,
                    bool average) {
  const std::uint32_t n = g.size();
  const std::uint32_t r = g.rank();
  if (n == 1)
    return {};
  const std::uint32_t left = mod(std::int64_t{r} - 1, n);
  const auto& o = g.options();
  layout lay(count, n, static_cast<std::int64_t>(std::max<std::size_t>(1, o.chunk_bytes / sizeof(T))),
             static_cast<std::int64_t>(std::max<std::size_t>(1, o.min_chunk_bytes / sizeof(T))), o.min_chunks);

  const std::uint32_t right = mod(std::int64_t{r} + 1, n);
  auto send = [&](std::uint32_t step, std::uint32_t seg, std::uint32_t c) {
    return send_chunk(g, right, id, step, c, base, lay.chunk(seg, c));
  };
  auto receive = [&](std::uint32_t step, ring_range range, std::uint32_t c) {
    return receive_chunk<T>(g, left, id, step, c, range);
  };

  if (reduce) {
    // Step 0: this rank's own values of segment r-1 go right.
    for (std::uint32_t c = 0; c < lay.chunks; ++c)
      if (auto ok = send(0, mod(std::int64_t{r} - 1, n), c); !ok)
        return ok;
    for (std::uint32_t s = 0; s + 1 < n; ++s) {
      const auto seg = mod(std::int64_t{r} - s - 2, n);
      for (std::uint32_t c = 0; c < lay.chunks; ++c) {
        auto range = lay.chunk(seg, c);
        if (range.begin == range.end)
          continue;
        // Wait for the left neighbour's partial sum of this chunk ...
        auto got = receive(s, range, c);
        if (!got)
          return got.error();
        // ... add it (one fixed order per element on every rank) ...
        T* dst = base + range.begin;
        const T* src = got->template data<T>();
        const auto len = range.end - range.begin;
        if (s + 2 < n) {
          // ... and pass it on at once: the next chunk is still on its way.
          // This rank never reads its partial sum of `seg` again (the final
          // value arrives in the all-gather), so the sum is written straight
          // into the outgoing chunk: one pass over the chunk instead of an
          // add into `base` and a copy out of it.
          auto out = g.chunk_buffer(right, dtype_of<T>::value, len);
          T* sum = out.template data<T>();
          for (std::int64_t i = 0; i < len; ++i)
            sum[i] = src[i] + dst[i];
          if (auto ok = g.send_right(id, s + 1, c, std::move(out)); !ok)
            return ok;
          continue;
        }
        // Last step: seg == r is final here. Average once, on the owner.
        // Allreduce: the all-gather starts chunk by chunk, right now, its
        // chunk written in the same pass as the final values.
        tensor out;
        T* also = nullptr;
        if (gather) {
          out = g.chunk_buffer(right, dtype_of<T>::value, len);
          also = out.template data<T>();
        }
        final_sum(dst, src, len, average, static_cast<T>(n), also);
        if (gather)
          if (auto ok = g.send_right(id, n, c, std::move(out)); !ok)
            return ok;
      }
    }
  } else if (gather) {
    // All-gather on its own: segment r is this rank's contribution.
    for (std::uint32_t c = 0; c < lay.chunks; ++c)
      if (auto ok = send(n, r, c); !ok)
        return ok;
  }

  if (gather) {
    for (std::uint32_t s = 0; s + 1 < n; ++s) {
      const auto seg = mod(std::int64_t{r} - s - 1, n);
      for (std::uint32_t c = 0; c < lay.chunks; ++c) {
        auto range = lay.chunk(seg, c);
        if (range.begin == range.end)
          continue;
        auto got = receive(n + s, range, c);
        if (!got)
          return got.error();
        // Copy the owner's final values (never recompute them) ...
        std::memcpy(base + range.begin, got->template data<T>(),
                    static_cast<std::size_t>(range.end - range.begin) * sizeof(T));
        // ... and forward the same tensor unchanged.
        if (s + 2 < n)
          if (auto ok = g.send_right(id, n + s + 1, c, *got); !ok)
            return ok;
      }
    }
  }
  return {};
}

/// A run of whole segments [begin, end) (ring_segment): what a rank of
/// halving_doubling keeps, gives or holds at one of its steps.
struct hd_block {
  std::uint32_t begin, end;
};

/// The elements of segments [block.begin, block.end) cut into chunks of at
/// most `chunk_elems`: both ends of an exchange compute the same cuts.
struct hd_chunks {
  std::int64_t begin, end, count;
  hd_chunks(std::int64_t total, std::uint32_t n, hd_block block, std::int64_t chunk_elems)
      : begin(ring_segment(total, n, block.begin).begin), end(ring_segment(total, n, block.end - 1).end),
        count(std::max<std::int64_t>(1, (end - begin + chunk_elems - 1) / chunk_elems)) {}
  ring_range chunk(std::int64_t c) const {
    const auto len = end - begin;
    return {begin + len * c / count, begin + len * (c + 1) / count};
  }
};

/// Recursive halving (reduce-scatter) then recursive doubling (all-gather)
/// over `base[0, count)` among the first n ranks, n the largest power of
/// two in the group (the whole group, joining checks, except for an
/// allreduce under `automatic`). Halving
/// step j pairs rank r with r ^ (n >> (j + 1)): each keeps the half of its
/// segments that its bit selects, sends the other half and adds what the
/// partner sent for its own, so after log2(n) steps segment r is reduced
/// on rank r. Doubling reverses it: rank r and r ^ 2^j swap the blocks they
/// hold. 2 log2(n) exchanges instead of the ring's 2(n-1), the same bytes.
/// Every final value is summed on its owner and copied to the others, so
/// every rank holds the same bits.
///
/// An allreduce on a group of another size folds it first (as MPICH's
/// Rabenseifner allreduce does): rank n + k sends its whole vector to rank
/// k, which adds it before the halving and sends it the result after the
/// doubling, 2 log2(n) + 2 exchanges in all.
///
/// Steps are numbered 0.. for halving, size.. for doubling, 2 size and
/// 2 size + 1 for the fold (a group runs one algorithm at a time, so no
/// ring step collides).
template <class T>
expected<void> halving_doubling(reducer_member& g, T* base, std::int64_t count, std::uint64_t id, bool reduce,
                                bool gather, bool average) {
  const std::uint32_t size = g.size();
  const std::uint32_t r = g.rank();
  if (size == 1)
    return {};
  std::uint32_t n = 1;
  while (n * 2 <= size)
    n *= 2;
  const auto chunk_elems = static_cast<std::int64_t>(std::max<std::size_t>(1, g.options().chunk_bytes / sizeof(T)));

  // The fold's one-way transfers of the whole vector, in the halving's chunks.
  const hd_chunks whole(count, n, hd_block{0, n}, chunk_elems);
  auto send_whole = [&](std::uint32_t to, std::uint32_t step) -> expected<void> {
    for (std::int64_t c = 0; c < whole.count; ++c)
      if (auto ok = send_chunk(g, to, id, step, static_cast<std::uint32_t>(c), base, whole.chunk(c)); !ok)
        return ok;
    return {};
  };
  auto receive_whole = [&](std::uint32_t from, std::uint32_t step, auto&& take) -> expected<void> {
    for (std::int64_t c = 0; c < whole.count; ++c) {
      auto range = whole.chunk(c);
      if (range.begin == range.end)
        continue;
      auto got = receive_chunk<T>(g, from, id, step, static_cast<std::uint32_t>(c), range);
      if (!got)
        return got.error();
      take(range, got->template data<T>());
    }
    return {};
  };
  auto copy_in = [&](ring_range range, const T* src) {
    std::memcpy(base + range.begin, src, static_cast<std::size_t>(range.end - range.begin) * sizeof(T));
  };
  if (r >= n) { // folded in: hand the vector over, take the result back
    if (auto ok = send_whole(r - n, 2 * size); !ok)
      return ok;
    return receive_whole(r - n, 2 * size + 1, copy_in);
  }
  const bool has_folded = r + n < size;
  if (has_folded)
    if (auto ok = receive_whole(r + n, 2 * size, [&](ring_range range, const T* src) {
          final_sum(base + range.begin, src, range.end - range.begin, false, T{1}, static_cast<T*>(nullptr));
        });
        !ok)
      return ok;

  // Trades chunks with `partner`: this rank's elements of `out` go to it,
  // its chunks of `in` come back, each handed to `take(range, chunk)`.
  // Paced: `window` chunks go out at once, and one more each time one of
  // the partner's arrives. A partner's chunk shows that it has reached this
  // step, so a host still receiving its previous step from someone else is
  // sent at most `window` chunks meanwhile. Unpaced (the whole half posted
  // at once) two senders met at one host's link and TCP lost segments by
  // the thousand where the ring, which never has two senders to one host,
  // lost none to speak of (docs/scaling.md, "Recursive halving-doubling").
  constexpr std::int64_t window = 2;
  auto exchange = [&](std::uint32_t step, std::uint32_t partner, hd_block out, hd_block in,
                      auto&& take) -> expected<void> {
    hd_chunks sending(count, n, out, chunk_elems);
    hd_chunks receiving(count, n, in, chunk_elems);
    auto send = [&](std::int64_t c) {
      return send_chunk(g, partner, id, step, static_cast<std::uint32_t>(c), base, sending.chunk(c));
    };
    std::int64_t sent = 0;
    for (; sent < std::min(window, sending.count); ++sent)
      if (auto ok = send(sent); !ok)
        return ok;
    for (std::int64_t c = 0; c < receiving.count; ++c) {
      auto range = receiving.chunk(c);
      if (range.begin != range.end) {
        auto got = receive_chunk<T>(g, partner, id, step, static_cast<std::uint32_t>(c), range);
        if (!got)
          return got.error();
        take(range, got->template data<T>());
      }
      if (sent < sending.count)
        if (auto ok = send(sent++); !ok)
          return ok;
    }
    for (; sent < sending.count; ++sent) // the partner had fewer chunks for this rank
      if (auto ok = send(sent); !ok)
        return ok;
    return {};
  };

  hd_block mine{0, n};
  if (reduce) {
    std::uint32_t step = 0;
    for (std::uint32_t half = n / 2; half >= 1; half /= 2, ++step) {
      const std::uint32_t partner = r ^ half;
      const std::uint32_t middle = mine.begin + half;
      const bool upper = (r & half) != 0;
      const hd_block keep = upper ? hd_block{middle, mine.end} : hd_block{mine.begin, middle};
      const hd_block give = upper ? hd_block{mine.begin, middle} : hd_block{middle, mine.end};
      const bool last = half == 1;
      auto ok = exchange(step, partner, give, keep, [&](ring_range range, const T* src) {
        final_sum(base + range.begin, src, range.end - range.begin, last && average, static_cast<T>(size),
                  static_cast<T*>(nullptr));
      });
      if (!ok)
        return ok;
      mine = keep;
    }
  } else {
    mine = {r, r + 1}; // an all-gather on its own: segment r is this rank's
  }
  if (gather) {
    std::uint32_t step = size;
    for (std::uint32_t width = 1; width < n; width *= 2, ++step) {
      const std::uint32_t partner = r ^ width;
      const std::uint32_t theirs = partner / width * width;
      const hd_block other{theirs, theirs + width};
      if (auto ok = exchange(step, partner, mine, other, copy_in); !ok)
        return ok;
      mine = {std::min(mine.begin, other.begin), std::max(mine.end, other.end)};
    }
  }
  if (has_folded)
    return send_whole(r + n, 2 * size + 1);
  return {};
}

/// The group's engine over messages. `count` is the whole collective's
/// (every rank's the same), so every rank of a group picks alike.
template <class T>
expected<void> over_messages(reducer_member& g, T* base, std::int64_t count, std::uint64_t id, bool reduce,
                             bool gather, bool average) {
  // A group whose size is not a power of two folds into one for an
  // allreduce, which moves the whole vector twice more: worth it for
  // smaller collectives only (docs/scaling.md). A reduce-scatter or an
  // all-gather alone keeps the ring there.
  constexpr std::size_t automatic_max_bytes = std::size_t{256} << 10;
  constexpr std::size_t automatic_folded_max_bytes = std::size_t{64} << 10;
  const auto n = g.size();
  const bool power_of_two = (n & (n - 1)) == 0;
  const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
  const auto algorithm = g.options().messages.value(); // set by joining
  if (algorithm == message_algorithm::halving_doubling ||
      (algorithm == message_algorithm::automatic &&
       (power_of_two ? bytes <= automatic_max_bytes : reduce && gather && bytes <= automatic_folded_max_bytes)))
    return halving_doubling(g, base, count, id, reduce, gather, average);
  return ring(g, base, count, id, reduce, gather, average);
}

template <class F> expected<void> typed(const tensor& t, F&& f) {
  if (t.type() == dtype::float32)
    return f(t.data<float>());
  return f(t.data<double>());
}

std::uint64_t pick(reducer_member& g, std::uint64_t id) { return id ? id : g.next_id(); }

expected<void> finish(reducer_member& g, std::uint64_t id, expected<void> result) {
  if (!result)
    g.forget(id);
  return result;
}

/// The same-host allreduce of `data` in place, in `ticket`'s turn (taken
/// now when there is none).
expected<void> same_host_sum(reducer_member& group, const tensor& data, bool average, std::uint64_t id,
                             std::optional<std::uint64_t> ticket = std::nullopt) {
  auto* ws = group.workspace();
  return typed(data, [&](auto* base) {
    return ws->allreduce(base, data.numel(), average, id, ticket ? *ticket : ws->take_ticket());
  });
}

/// ring_allreduce with this call's place in the same-host order (taken
/// when the call was made, see same_host_workspace.hpp "Order").
expected<void> allreduce(reducer_member& group, const tensor& data, allreduce_options options,
                         std::optional<std::uint64_t> ticket) {
  if (auto ok = check(data, "ring_allreduce"); !ok)
    return ok;
  auto id = pick(group, options.context_id);
  const bool average = options.op == reduce_op::average;
  if (group.workspace() != nullptr)
    return same_host_sum(group, data, average, id, ticket);
  return finish(group, id, typed(data, [&](auto* base) {
                  return over_messages(group, base, data.numel(), id, true, true, average);
                }));
}

} // namespace

expected<void> ring_allreduce(reducer_group& group, const tensor& data, allreduce_options options) {
  return allreduce(reducer_group_access::member(group), data, options, std::nullopt);
}

std::future<expected<void>> ring_allreduce_async(reducer_group& handle, tensor data, allreduce_options options) {
  auto& group = reducer_group_access::member(handle);
  // Take the id (and the same-host turn) now, on the caller's thread, so
  // that both follow call order. A call refused here takes no turn.
  if (auto ok = check(data, "ring_allreduce"); !ok) {
    std::promise<expected<void>> refused;
    refused.set_value(ok);
    return refused.get_future();
  }
  if (!options.context_id)
    options.context_id = group.next_id();
  std::optional<std::uint64_t> ticket;
  if (auto* ws = group.workspace())
    ticket = ws->take_ticket();
  // The member lives while this runs, whatever becomes of the handle.
  return std::async(std::launch::async,
                    [member = reducer_group_access::shared(handle), data = std::move(data), options, ticket] {
                      return allreduce(*member, data, options, ticket);
                    });
}

expected<tensor> reduce_scatter(reducer_group& handle, const tensor& input, reduce_scatter_options options) {
  auto& group = reducer_group_access::member(handle);
  if (auto ok = check(input, "reduce_scatter"); !ok)
    return ok.error();
  auto id = pick(group, options.context_id);
  const bool average = options.op == reduce_op::average;
  auto seg = ring_segment(input.numel(), group.size(), group.rank());
  if (auto* ws = group.workspace()) {
    // Only the other ranks' segments leave this rank, and only its own
    // comes back reduced (same_host_workspace.hpp).
    auto out = tensor::empty({seg.end - seg.begin}, input.type());
    auto ok = typed(input, [&](auto* base) {
      using T = std::remove_pointer_t<decltype(base)>;
      return ws->reduce_scatter(base, input.numel(), out.data<T>(), average, id, ws->take_ticket());
    });
    if (!ok)
      return ok.error();
    return out;
  }
  auto work = input.clone();
  auto ok = finish(group, id, typed(work, [&](auto* base) {
                     return over_messages(group, base, work.numel(), id, true, false, average);
                   }));
  if (!ok)
    return ok.error();
  return work.flatten().slice(0, seg.begin, seg.end).clone();
}

expected<void> all_gather_into(reducer_group& handle, const tensor& mine, const tensor& out,
                               all_gather_options options) {
  auto& group = reducer_group_access::member(handle);
  if (auto ok = check(mine, "all_gather"); !ok)
    return ok;
  if (auto ok = check(out, "all_gather: the output"); !ok)
    return ok;
  const auto m = mine.numel();
  if (out.type() != mine.type() || out.numel() != m * group.size())
    return make_error(errc::invalid_argument, "all_gather: the output is {} of {} elements; want {} of {} ({} ranks)",
                      out.type(), out.numel(), mine.type(), m * group.size(), group.size());
  auto id = pick(group, options.context_id);
  if (auto* ws = group.workspace())
    return typed(mine, [&](auto* base) {
      using T = std::remove_pointer_t<decltype(base)>;
      return ws->all_gather(base, m, out.data<T>(), id, ws->take_ticket());
    });
  out.flatten().slice(0, m * group.rank(), m * (group.rank() + 1)).copy_from(mine.flatten());
  return finish(group, id, typed(out, [&](auto* base) {
                  return over_messages(group, base, out.numel(), id, false, true, false);
                }));
}

expected<tensor> all_gather(reducer_group& handle, const tensor& mine, all_gather_options options) {
  if (auto ok = check(mine, "all_gather"); !ok)
    return ok.error();
  // From buffer(): on one host the output lies in the node's arena, and the
  // peers write their pieces straight into it (one copy per piece, not two).
  auto out = handle.buffer({mine.numel() * handle.size()}, mine.type());
  if (auto ok = all_gather_into(handle, mine, out, options); !ok)
    return ok.error();
  return out;
}

expected<void> broadcast(reducer_group& handle, const tensor& data, broadcast_options options) {
  auto& group = reducer_group_access::member(handle);
  if (auto ok = check(data, "broadcast"); !ok)
    return ok;
  if (options.root >= group.size())
    return make_error(errc::invalid_argument, "broadcast: root {} is outside the group of {}", options.root,
                      group.size());
  auto id = pick(group, options.context_id);
  const std::uint32_t n = group.size();
  if (n == 1)
    return {};
  if (auto* ws = group.workspace())
    return typed(data, [&](auto* base) {
      return ws->broadcast(base, data.numel(), options.root, id, ws->take_ticket());
    });
  const auto position = mod(std::int64_t{group.rank()} - options.root, n); // 0 = root
  const std::uint32_t left = mod(std::int64_t{group.rank()} - 1, n);
  return finish(group, id, typed(data, [&](auto* base) -> expected<void> {
                  using T = std::remove_pointer_t<decltype(base)>;
                  const auto count = data.numel();
                  const auto chunk = static_cast<std::int64_t>(std::max<std::size_t>(1, group.options().chunk_bytes / sizeof(T)));
                  for (std::int64_t b = 0, c = 0; b < count; b += chunk, ++c) {
                    const auto len = std::min(chunk, count - b);
                    const auto index = static_cast<std::uint32_t>(c);
                    if (position == 0) {
                      // The root: every chunk right, without waiting.
                      const auto right = mod(std::int64_t{group.rank()} + 1, n);
                      if (auto ok = group.send_right(id, 0, index, copy_of(group, right, base + b, len)); !ok)
                        return ok;
                      continue;
                    }
                    // The others: copy each chunk in as it arrives, pass it on.
                    auto got = group.receive(left, id, 0, index);
                    if (!got)
                      return got.error();
                    if (got->numel() != len)
                      return make_error(errc::malformed_message, "broadcast: chunk {} from {} has {} elements, want {}",
                                        c, group.describe(left), got->numel(), len);
                    std::memcpy(base + b, got->template data<T>(), static_cast<std::size_t>(len) * sizeof(T));
                    if (position + 1 < n)
                      if (auto ok = group.send_right(id, 0, index, *got); !ok)
                        return ok;
                  }
                  return {};
                }));
}

} // namespace troupe::parallel
