// Chrome JSON, summary and SVG from decoded trace files. All three start
// from one `timeline`: records placed on the merged clock, handlers and spans
// paired into intervals, sends matched to receives by flow id.
#include "troupe/actors/trace_report.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

namespace troupe::trace {

namespace {

struct track {
  std::size_t file = 0;
  std::string name; // actor name, "thread N", or "<actor> data"
  bool data = false;
  std::uint32_t tid = 0;         // 1-based within the file
  std::size_t main = 0;          // for a data track: its actor's track
};

struct slice {
  std::size_t track = 0;
  std::int64_t start = 0, end = 0;
  std::string kind;
  std::uint64_t flow = 0;
  std::uint32_t step = no_step, micro_batch = no_step;
  bool unfinished = false;
  bool span = false; // a free-form span, not a handler
};

struct point {
  std::size_t track = 0;
  std::int64_t ts = 0;
  event_type type{};
  std::string kind, peer, actor;
  std::uint64_t bytes = 0, flow = 0;
  std::uint32_t step = no_step, micro_batch = no_step;
};

struct transfer {
  std::size_t track = 0;       // the data track
  std::size_t actor_track = 0; // the actor's (or thread's) main track
  bool has_actor = false;
  std::int64_t start = 0, end = 0;
  event_type type{};
  std::string peer;
  std::uint64_t bytes = 0, flow = 0;
};

struct counter_point {
  std::size_t file = 0;
  std::int64_t ts = 0;
  std::string name;
  std::int64_t value = 0;
};

struct drop_point {
  std::size_t file = 0;
  std::int64_t ts = 0;
  std::uint64_t count = 0;
};

struct timeline {
  std::vector<track> tracks;
  std::vector<slice> slices;
  std::vector<point> points;
  std::vector<transfer> transfers;
  std::vector<counter_point> counters;
  std::vector<drop_point> drops;
  std::vector<std::pair<std::int64_t, std::int64_t>> file_span; // first, last record
  std::int64_t origin = 0; // global ns of time 0
  std::int64_t end = 0;    // relative ns of the last record
  // Matched flows: indices into points (send, receive) and transfers (write, read).
  std::vector<std::pair<std::size_t, std::size_t>> message_flows;
  std::vector<std::pair<std::size_t, std::size_t>> data_flows;
  std::vector<bool> send_matched; // per point: a send with its receive, or a receive with its send
};

std::string process_name(const trace_file& f) {
  return fmt::format("{} (pid {})", f.header.node.empty() ? "?" : f.header.node, f.header.pid);
}

timeline build_timeline(std::span<const trace_file> files, std::vector<std::string>& warnings) {
  timeline t;
  t.origin = std::numeric_limits<std::int64_t>::max();
  for (const auto& f : files)
    for (const auto& r : f.records)
      t.origin = std::min(t.origin, f.global_ns(r.time_ns - r.duration_ns * (r.type == event_type::data_write || r.type == event_type::data_read)));
  if (t.origin == std::numeric_limits<std::int64_t>::max())
    t.origin = 0;

  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    const auto& f = files[fi];
    std::vector<record> records = f.records;
    std::stable_sort(records.begin(), records.end(),
                     [](const record& a, const record& b) { return a.time_ns < b.time_ns; });
    std::unordered_map<std::uint64_t, std::size_t> track_of;
    std::uint32_t next_tid = 1;
    auto main_track = [&](const record& r) {
      std::uint64_t key = r.actor ? r.actor : (std::uint64_t{1} << 32) | r.thread;
      auto [it, fresh] = track_of.try_emplace(key, t.tracks.size());
      if (fresh) {
        track tr;
        tr.file = fi;
        tr.name = r.actor ? f.name(r.actor) : fmt::format("thread {}", r.thread);
        tr.tid = next_tid++;
        tr.main = t.tracks.size();
        t.tracks.push_back(tr);
      }
      return it->second;
    };
    auto data_track = [&](const record& r) {
      auto main = main_track(r);
      std::uint64_t key = (r.actor ? r.actor : (std::uint64_t{1} << 32) | r.thread) |
                          (std::uint64_t{1} << 40);
      auto [it, fresh] = track_of.try_emplace(key, t.tracks.size());
      if (fresh) {
        track tr;
        tr.file = fi;
        tr.name = t.tracks[main].name + " data";
        tr.data = true;
        tr.tid = next_tid++;
        tr.main = main;
        t.tracks.push_back(tr);
      }
      return it->second;
    };
    struct open_slice {
      std::int64_t start;
      std::uint32_t kind;
      std::uint64_t flow;
      std::uint32_t step, micro_batch;
    };
    std::unordered_map<std::size_t, std::vector<open_slice>> open_handlers, open_spans;
    std::uint64_t unmatched_ends = 0;
    std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = 0;
    auto close = [&](std::vector<open_slice>& stack, std::size_t tr, const record& r,
                     std::int64_t ts, bool span) {
      // The innermost open slice of the same kind ends here.
      for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
        if (it->kind != r.kind)
          continue;
        t.slices.push_back({tr, it->start, ts, f.name(it->kind), it->flow, it->step,
                            it->micro_batch, false, span});
        stack.erase(std::next(it).base());
        return;
      }
      ++unmatched_ends;
    };
    for (const auto& r : records) {
      auto ts = f.global_ns(r.time_ns) - t.origin;
      first = std::min(first, r.type == event_type::data_write || r.type == event_type::data_read
                                  ? ts - r.duration_ns
                                  : ts);
      last = std::max(last, ts);
      switch (r.type) {
      case event_type::handler_start:
        open_handlers[main_track(r)].push_back({ts, r.kind, r.flow_id, r.step, r.micro_batch});
        break;
      case event_type::handler_end: {
        auto tr = main_track(r);
        close(open_handlers[tr], tr, r, ts, false);
        break;
      }
      case event_type::span_begin:
        open_spans[main_track(r)].push_back({ts, r.kind, 0, no_step, no_step});
        break;
      case event_type::span_end: {
        auto tr = main_track(r);
        close(open_spans[tr], tr, r, ts, true);
        break;
      }
      case event_type::message_sent:
      case event_type::message_received:
        t.points.push_back({main_track(r), ts, r.type, f.name(r.kind), f.name(r.peer),
                            f.name(r.actor), r.value, r.flow_id, r.step, r.micro_batch});
        break;
      case event_type::data_write:
      case event_type::data_read: {
        transfer x;
        x.track = data_track(r);
        x.actor_track = t.tracks[x.track].main;
        x.has_actor = r.actor != 0;
        x.start = ts - r.duration_ns;
        x.end = ts;
        x.type = r.type;
        x.peer = f.name(r.peer);
        x.bytes = r.value;
        x.flow = r.flow_id;
        t.transfers.push_back(std::move(x));
        break;
      }
      case event_type::counter:
        t.counters.push_back({fi, ts, f.name(r.kind), static_cast<std::int64_t>(r.value)});
        break;
      case event_type::dropped:
        t.drops.push_back({fi, ts, r.value});
        break;
      default: break;
      }
    }
    if (records.empty())
      first = last = 0;
    // Slices still open when the trace ends (the process was killed) run to
    // its last record.
    for (auto* stacks : {&open_handlers, &open_spans})
      for (auto& [tr, stack] : *stacks)
        for (const auto& o : stack)
          t.slices.push_back({tr, o.start, last, f.name(o.kind), o.flow, o.step, o.micro_batch,
                              true, stacks == &open_spans});
    if (unmatched_ends)
      warnings.push_back(fmt::format("{}: {} handler or span ends without a start (ignored)",
                                     f.path, unmatched_ends));
    t.file_span.emplace_back(first, last);
    t.end = std::max(t.end, last);
  }
  std::sort(t.slices.begin(), t.slices.end(), [](const slice& a, const slice& b) {
    return std::tie(a.track, a.start, b.end) < std::tie(b.track, b.start, a.end);
  });

  // Flows: a send and a receive (a write and a read) with the same flow id.
  std::unordered_map<std::uint64_t, std::size_t> sends, writes;
  std::uint64_t duplicates = 0;
  for (std::size_t i = 0; i < t.points.size(); ++i)
    if (t.points[i].type == event_type::message_sent && t.points[i].flow &&
        !sends.emplace(t.points[i].flow, i).second)
      ++duplicates;
  for (std::size_t i = 0; i < t.transfers.size(); ++i)
    if (t.transfers[i].type == event_type::data_write && t.transfers[i].flow)
      writes.emplace(t.transfers[i].flow, i);
  t.send_matched.assign(t.points.size(), false);
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    const auto& p = t.points[i];
    if (p.type != event_type::message_received || !p.flow)
      continue;
    if (auto it = sends.find(p.flow); it != sends.end()) {
      t.message_flows.emplace_back(it->second, i);
      t.send_matched[it->second] = t.send_matched[i] = true;
      sends.erase(it); // one receive per send
    }
  }
  for (std::size_t i = 0; i < t.transfers.size(); ++i) {
    const auto& x = t.transfers[i];
    if (x.type != event_type::data_read || !x.flow)
      continue;
    if (auto it = writes.find(x.flow); it != writes.end()) {
      t.data_flows.emplace_back(it->second, i);
      writes.erase(it);
    }
  }
  if (duplicates)
    warnings.push_back(fmt::format("{} sends reuse a flow id already sent (only the first is "
                                   "matched)",
                                   duplicates));
  return t;
}

// ---- JSON helpers ---------------------------------------------------------

// A JSON string literal; bytes outside printable ASCII are escaped, so even a
// name from a damaged file yields valid JSON.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string us(std::int64_t ns) { return fmt::format("{:.3f}", static_cast<double>(ns) / 1000.0); }

std::string step_args(std::uint32_t step, std::uint32_t micro_batch) {
  std::string out;
  if (step != no_step)
    out += fmt::format(",\"step\":{}", step);
  if (micro_batch != no_step)
    out += fmt::format(",\"micro_batch\":{}", micro_batch);
  return out;
}

// ---- interval helpers -----------------------------------------------------

using interval = std::pair<std::int64_t, std::int64_t>;

std::vector<interval> merge(std::vector<interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<interval> out;
  for (auto [s, e] : v) {
    if (!out.empty() && s <= out.back().second)
      out.back().second = std::max(out.back().second, e);
    else
      out.emplace_back(s, e);
  }
  return out;
}

std::int64_t total(const std::vector<interval>& merged) {
  std::int64_t sum = 0;
  for (auto [s, e] : merged)
    sum += e - s;
  return sum;
}

// Length of [s, e) covered by `merged` (sorted, disjoint).
std::int64_t overlap(const std::vector<interval>& merged, std::int64_t s, std::int64_t e) {
  auto it = std::lower_bound(merged.begin(), merged.end(), s,
                             [](const interval& iv, std::int64_t x) { return iv.second <= x; });
  std::int64_t sum = 0;
  for (; it != merged.end() && it->first < e; ++it)
    sum += std::min(e, it->second) - std::max(s, it->first);
  return sum;
}

double percentile(std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty())
    return 0;
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return static_cast<double>(sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1]);
}

} // namespace

// ---- Chrome JSON ------------------------------------------------------------

std::string chrome_trace_json(std::span<const trace_file> files, std::vector<std::string>& warnings) {
  auto t = build_timeline(files, warnings);
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& event) {
    if (!first)
      out += ",\n";
    first = false;
    out += event;
  };
  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    const auto& f = files[fi];
    emit(fmt::format(R"({{"name":"process_name","ph":"M","pid":{},"args":{{"name":{}}}}})", fi + 1,
                     quote(process_name(f))));
    emit(fmt::format(R"({{"name":"process_sort_index","ph":"M","pid":{},"args":{{"sort_index":{}}}}})",
                     fi + 1, fi));
    if (f.has_clock_offset)
      emit(fmt::format(R"({{"name":"process_labels","ph":"M","pid":{},"args":{{"labels":"clock offset {} ns +- {} ns"}}}})",
                       fi + 1, f.clock_offset_ns, f.clock_uncertainty_ns));
  }
  for (const auto& tr : t.tracks) {
    emit(fmt::format(R"({{"name":"thread_name","ph":"M","pid":{},"tid":{},"args":{{"name":{}}}}})",
                     tr.file + 1, tr.tid, quote(tr.name)));
    emit(fmt::format(R"({{"name":"thread_sort_index","ph":"M","pid":{},"tid":{},"args":{{"sort_index":{}}}}})",
                     tr.file + 1, tr.tid, tr.tid));
  }
  for (const auto& s : t.slices) {
    const auto& tr = t.tracks[s.track];
    emit(fmt::format(
        R"({{"name":{},"cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":{},"args":{{"flow":"0x{:x}"{}{}}}}})",
        quote(s.kind.empty() ? "?" : s.kind), s.span ? "span" : "handler", us(s.start),
        us(s.end - s.start), tr.file + 1, tr.tid, s.flow, step_args(s.step, s.micro_batch),
        s.unfinished ? ",\"unfinished\":true" : ""));
  }
  for (const auto& p : t.points) {
    const auto& tr = t.tracks[p.track];
    bool sent = p.type == event_type::message_sent;
    emit(fmt::format(
        R"({{"name":{},"cat":"message","ph":"i","s":"t","ts":{},"pid":{},"tid":{},"args":{{"{}":{},"bytes":{},"flow":"0x{:x}"{}}}}})",
        quote(fmt::format("{} {}", sent ? "send" : "recv", p.kind)), us(p.ts), tr.file + 1, tr.tid,
        sent ? "to" : "from", quote(p.peer), p.bytes, p.flow, step_args(p.step, p.micro_batch)));
  }
  // Flow arrows. "s" binds to the slice enclosing the send (its handler);
  // "f" without "bp" binds to the next slice on the receiver's track, which
  // is the handler that takes the message.
  for (auto [si, ri] : t.message_flows) {
    const auto& s = t.points[si];
    const auto& r = t.points[ri];
    emit(fmt::format(R"({{"name":"message","cat":"flow","ph":"s","id":"0x{:x}","ts":{},"pid":{},"tid":{}}})",
                     s.flow, us(s.ts), t.tracks[s.track].file + 1, t.tracks[s.track].tid));
    emit(fmt::format(R"({{"name":"message","cat":"flow","ph":"f","id":"0x{:x}","ts":{},"pid":{},"tid":{}}})",
                     r.flow, us(r.ts), t.tracks[r.track].file + 1, t.tracks[r.track].tid));
  }
  for (const auto& x : t.transfers) {
    const auto& tr = t.tracks[x.track];
    bool write = x.type == event_type::data_write;
    emit(fmt::format(
        R"({{"name":{},"cat":"data","ph":"X","ts":{},"dur":{},"pid":{},"tid":{},"args":{{"peer":{},"bytes":{},"flow":"0x{:x}"}}}})",
        quote(fmt::format("{} {}", write ? "write to" : "read from", x.peer)), us(x.start),
        us(x.end - x.start), tr.file + 1, tr.tid, quote(x.peer), x.bytes, x.flow));
  }
  // Transfer arrows bind to the enclosing transfer slices on both ends
  // (the read's end time lies inside its own slice's closing edge, so bind
  // at its start).
  for (auto [wi, ri] : t.data_flows) {
    const auto& w = t.transfers[wi];
    const auto& r = t.transfers[ri];
    emit(fmt::format(R"({{"name":"transfer","cat":"data_flow","ph":"s","id":"0x{:x}","ts":{},"pid":{},"tid":{}}})",
                     w.flow, us(w.start), t.tracks[w.track].file + 1, t.tracks[w.track].tid));
    emit(fmt::format(R"({{"name":"transfer","cat":"data_flow","ph":"f","bp":"e","id":"0x{:x}","ts":{},"pid":{},"tid":{}}})",
                     r.flow, us(r.start), t.tracks[r.track].file + 1, t.tracks[r.track].tid));
  }
  for (const auto& c : t.counters)
    emit(fmt::format(R"({{"name":{},"ph":"C","ts":{},"pid":{},"args":{{"value":{}}}}})",
                     quote(c.name), us(c.ts), c.file + 1, c.value));
  for (const auto& d : t.drops)
    emit(fmt::format(R"({{"name":"dropped {} records","cat":"trace","ph":"i","s":"p","ts":{},"pid":{},"tid":0}})",
                     d.count, us(d.ts), d.file + 1));
  out += fmt::format("\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"origin_unix_ns\":{},"
                     "\"files\":{}}}}}\n",
                     t.origin, files.size());
  return out;
}

// ---- summary ----------------------------------------------------------------

trace_summary summarize(std::span<const trace_file> files, std::vector<std::string>& warnings) {
  auto t = build_timeline(files, warnings);
  trace_summary sum;
  sum.files = files.size();
  sum.span_ns = static_cast<double>(t.end);
  for (std::size_t fi = 0; fi < files.size(); ++fi)
    sum.span_ns = std::max(sum.span_ns, static_cast<double>(t.file_span[fi].second - std::min<std::int64_t>(0, t.file_span[fi].first)));
  for (const auto& f : files)
    sum.dropped += f.dropped;

  // Handler intervals per track, and per step.
  std::vector<std::vector<interval>> busy(t.tracks.size());
  std::vector<std::uint64_t> handled(t.tracks.size());
  std::map<std::uint32_t, interval> step_span;
  std::vector<std::map<std::uint32_t, std::int64_t>> step_busy(t.tracks.size());
  for (const auto& s : t.slices) {
    if (s.span)
      continue;
    busy[s.track].emplace_back(s.start, s.end);
    ++handled[s.track];
    if (s.step != no_step) {
      auto [it, fresh] = step_span.try_emplace(s.step, s.start, s.end);
      if (!fresh) {
        it->second.first = std::min(it->second.first, s.start);
        it->second.second = std::max(it->second.second, s.end);
      }
      step_busy[s.track][s.step] += s.end - s.start;
    }
  }
  std::vector<bool> has_messages(t.tracks.size());
  for (const auto& p : t.points)
    has_messages[p.track] = true;
  std::vector<std::vector<interval>> merged(t.tracks.size());
  for (std::size_t i = 0; i < t.tracks.size(); ++i) {
    merged[i] = merge(busy[i]);
    const auto& tr = t.tracks[i];
    if (tr.data || (busy[i].empty() && !has_messages[i]))
      continue;
    actor_summary a;
    a.node = files[tr.file].header.node;
    a.actor = tr.name;
    a.handled = handled[i];
    a.busy_ns = static_cast<double>(total(merged[i]));
    auto [first, last] = t.file_span[tr.file];
    a.span_ns = static_cast<double>(last - first);
    a.busy_fraction = a.span_ns > 0 ? a.busy_ns / a.span_ns : 0;
    if (!step_busy[i].empty()) {
      double in_steps = 0, spans = 0;
      for (auto [step, ns] : step_busy[i]) {
        in_steps += static_cast<double>(ns);
        spans += static_cast<double>(step_span[step].second - step_span[step].first);
      }
      if (spans > 0)
        a.bubble_fraction = 1.0 - in_steps / spans;
    }
    sum.actors.push_back(std::move(a));
  }

  // Edges.
  struct edge_acc {
    std::uint64_t messages = 0, bytes = 0;
    std::vector<std::int64_t> latency;
  };
  std::map<std::pair<std::string, std::string>, edge_acc> edges;
  for (std::size_t i = 0; i < t.points.size(); ++i) {
    const auto& p = t.points[i];
    if (p.type == event_type::message_sent) {
      auto& e = edges[{t.tracks[p.track].name, p.peer}];
      ++e.messages;
      e.bytes += p.bytes;
    } else if (!t.send_matched[i]) {
      auto& e = edges[{p.peer, t.tracks[p.track].name}];
      ++e.messages;
      e.bytes += p.bytes;
    }
  }
  for (auto [si, ri] : t.message_flows) {
    const auto& s = t.points[si];
    edges[{t.tracks[s.track].name, s.peer}].latency.push_back(t.points[ri].ts - s.ts);
  }
  for (auto& [key, acc] : edges) {
    edge_summary e;
    e.sender = key.first;
    e.receiver = key.second;
    e.messages = acc.messages;
    e.bytes = acc.bytes;
    e.matched = acc.latency.size();
    std::sort(acc.latency.begin(), acc.latency.end());
    e.p50_ns = percentile(acc.latency, 50);
    e.p90_ns = percentile(acc.latency, 90);
    e.p99_ns = percentile(acc.latency, 99);
    sum.messages += e.messages;
    sum.message_bytes += e.bytes;
    sum.edges.push_back(std::move(e));
  }

  // Data plane, and how much of it ran while another actor on the node computed.
  std::map<std::pair<std::string, std::size_t>, std::vector<interval>> others_cache;
  double transfer_ns = 0, hidden_ns = 0;
  for (const auto& x : t.transfers) {
    (x.type == event_type::data_write ? sum.data_write_bytes : sum.data_read_bytes) += x.bytes;
    if (x.end <= x.start)
      continue;
    const auto& node = files[t.tracks[x.track].file].header.node;
    auto exclude = x.has_actor ? x.actor_track : std::numeric_limits<std::size_t>::max();
    auto [it, fresh] = others_cache.try_emplace({node, exclude});
    if (fresh) {
      std::vector<interval> all;
      for (std::size_t i = 0; i < t.tracks.size(); ++i)
        if (i != exclude && files[t.tracks[i].file].header.node == node)
          all.insert(all.end(), merged[i].begin(), merged[i].end());
      it->second = merge(std::move(all));
    }
    transfer_ns += static_cast<double>(x.end - x.start);
    hidden_ns += static_cast<double>(overlap(it->second, x.start, x.end));
  }
  if (transfer_ns > 0)
    sum.hidden_communication = hidden_ns / transfer_ns;

  // Gradient buckets reduced while backward still ran in the same process
  // (data_parallel records both as handlers).
  std::map<std::size_t, std::vector<interval>> backward_by_file;
  for (const auto& s : t.slices)
    if (!s.span && s.kind == "backward")
      backward_by_file[t.tracks[s.track].file].emplace_back(s.start, s.end);
  for (auto& [file, spans] : backward_by_file)
    spans = merge(std::move(spans));
  double reduce_ns = 0, reduce_hidden_ns = 0;
  for (const auto& s : t.slices) {
    if (s.span || s.kind != "allreduce" || s.end <= s.start)
      continue;
    reduce_ns += static_cast<double>(s.end - s.start);
    if (auto it = backward_by_file.find(t.tracks[s.track].file); it != backward_by_file.end())
      reduce_hidden_ns += static_cast<double>(overlap(it->second, s.start, s.end));
  }
  if (reduce_ns > 0)
    sum.hidden_reduction = reduce_hidden_ns / reduce_ns;
  return sum;
}

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

std::string percent(std::optional<double> v) {
  return v ? fmt::format("{:.1f}", *v * 100) : std::string("-");
}

} // namespace

std::string format_summary(const trace_summary& s) {
  std::string out = fmt::format(
      "# troupe trace: {} file(s), span {:.3f} ms, {} messages ({}), data plane {} written / {} "
      "read, {} records dropped\n",
      s.files, s.span_ns / 1e6, s.messages, human_bytes(static_cast<double>(s.message_bytes)),
      human_bytes(static_cast<double>(s.data_write_bytes)),
      human_bytes(static_cast<double>(s.data_read_bytes)), s.dropped);
  out += fmt::format("# communication hidden behind compute: {}\n\n",
                     s.hidden_communication
                         ? fmt::format("{:.1f}%", *s.hidden_communication * 100)
                         : std::string("n/a (no timed data-plane transfers)"));
  if (s.hidden_reduction) // replace the blank line: one more header line
    out.insert(out.size() - 1, fmt::format("# gradient reduction hidden behind backward: {:.1f}%\n",
                                           *s.hidden_reduction * 100));
  std::size_t w_actor = 5, w_node = 4;
  for (const auto& a : s.actors) {
    w_actor = std::max(w_actor, a.actor.size());
    w_node = std::max(w_node, a.node.size());
  }
  out += fmt::format("{:<{}}  {:<{}}  {:>9}  {:>12}  {:>7}  {:>8}\n", "actor", w_actor, "node",
                     w_node, "handled", "busy ms", "busy %", "bubble %");
  for (const auto& a : s.actors)
    out += fmt::format("{:<{}}  {:<{}}  {:>9}  {:>12.3f}  {:>7.1f}  {:>8}\n", a.actor, w_actor,
                       a.node, w_node, a.handled, a.busy_ns / 1e6, a.busy_fraction * 100,
                       percent(a.bubble_fraction));
  std::size_t w_edge = 4;
  for (const auto& e : s.edges)
    w_edge = std::max(w_edge, e.sender.size() + e.receiver.size() + 4);
  out += fmt::format("\n{:<{}}  {:>9}  {:>12}  {:>8}  {:>10}  {:>10}  {:>10}\n", "edge", w_edge,
                     "messages", "bytes", "matched", "p50 us", "p90 us", "p99 us");
  for (const auto& e : s.edges)
    out += fmt::format("{:<{}}  {:>9}  {:>12}  {:>8}  {:>10.3f}  {:>10.3f}  {:>10.3f}\n",
                       e.sender + " -> " + e.receiver, w_edge, e.messages, e.bytes, e.matched,
                       e.p50_ns / 1e3, e.p90_ns / 1e3, e.p99_ns / 1e3);
  return out;
}

std::string summary_json(const trace_summary& s) {
  auto opt = [](std::optional<double> v) { return v ? fmt::format("{}", *v) : std::string("null"); };
  std::string out = fmt::format(
      "{{\"files\":{},\"span_ns\":{},\"messages\":{},\"message_bytes\":{},\"data_write_bytes\":{},"
      "\"data_read_bytes\":{},\"dropped\":{},\"hidden_communication\":{},\"hidden_reduction\":{},"
      "\"actors\":[",
      s.files, s.span_ns, s.messages, s.message_bytes, s.data_write_bytes, s.data_read_bytes,
      s.dropped, opt(s.hidden_communication), opt(s.hidden_reduction));
  for (std::size_t i = 0; i < s.actors.size(); ++i) {
    const auto& a = s.actors[i];
    out += fmt::format("{}{{\"actor\":{},\"node\":{},\"handled\":{},\"busy_ns\":{},\"span_ns\":{},"
                       "\"busy_fraction\":{},\"bubble_fraction\":{}}}",
                       i ? "," : "", quote(a.actor), quote(a.node), a.handled, a.busy_ns,
                       a.span_ns, a.busy_fraction, opt(a.bubble_fraction));
  }
  out += "],\"edges\":[";
  for (std::size_t i = 0; i < s.edges.size(); ++i) {
    const auto& e = s.edges[i];
    out += fmt::format("{}{{\"sender\":{},\"receiver\":{},\"messages\":{},\"bytes\":{},"
                       "\"matched\":{},\"p50_ns\":{},\"p90_ns\":{},\"p99_ns\":{}}}",
                       i ? "," : "", quote(e.sender), quote(e.receiver), e.messages, e.bytes,
                       e.matched, e.p50_ns, e.p90_ns, e.p99_ns);
  }
  return out + "]}\n";
}

// ---- SVG ------------------------------------------------------------------------

namespace {

std::string xml(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    case '\'': out += "&apos;"; break;
    default: out += (c < 0x20 || c >= 0x7f) ? '?' : static_cast<char>(c);
    }
  }
  return out;
}

std::string colour(std::size_t i) {
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#edc948",
                                  "#76b7b2", "#ff9da7", "#9c755f", "#86bcb6", "#d37295", "#8cd17d"};
  if (i < std::size(palette))
    return palette[i];
  return fmt::format("hsl({:.0f},55%,55%)", std::fmod(static_cast<double>(i) * 137.508, 360.0));
}

// Tick spacing of 1, 2 or 5 times a power of ten, for about `target` ticks.
double tick_step(double span, int target) {
  double raw = span / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw)
      return m * mag;
  return 10 * mag;
}

} // namespace

std::string render_svg(std::span<const trace_file> files, const svg_options& options,
                       std::vector<std::string>& warnings) {
  auto t = build_timeline(files, warnings);
  const double label_w = 210, right = 20, row_h = 22, group_h = 20, top = 64;
  const double width = std::max(400, options.width);
  const double plot_w = width - label_w - right;

  // The window [w0, w1): explicit, the last steps, or the whole run.
  std::int64_t w0 = 0, w1 = std::max<std::int64_t>(1, t.end);
  std::string window_text = "the whole run";
  std::uint32_t max_step = 0;
  bool have_steps = false;
  for (const auto& s : t.slices)
    if (s.step != no_step) {
      max_step = have_steps ? std::max(max_step, s.step) : s.step;
      have_steps = true;
    }
  if (options.from_ms || options.to_ms) {
    w0 = std::clamp<std::int64_t>(static_cast<std::int64_t>(options.from_ms.value_or(0) * 1e6), 0, t.end);
    const auto to = options.to_ms ? static_cast<std::int64_t>(*options.to_ms * 1e6) : t.end;
    w1 = std::clamp<std::int64_t>(to, w0 + 1, std::max<std::int64_t>(w0 + 1, t.end));
    window_text = fmt::format("{:.3f} to {:.3f} ms", static_cast<double>(w0) / 1e6, static_cast<double>(w1) / 1e6);
  } else if (options.last_steps > 0 && have_steps) {
    const std::uint32_t first = max_step + 1 > options.last_steps ? max_step + 1 - options.last_steps : 0;
    bool any = false;
    for (const auto& s : t.slices)
      if (s.step != no_step && s.step >= first) {
        w0 = any ? std::min(w0, s.start) : s.start;
        w1 = any ? std::max(w1, s.end) : s.end;
        any = true;
      }
    w1 = std::max(w1, w0 + 1);
    window_text = first == max_step ? fmt::format("step {}", max_step)
                                    : fmt::format("steps {} to {}", first, max_step);
  }
  const double span = static_cast<double>(w1 - w0);
  auto in_window = [&](std::int64_t a, std::int64_t b) { return b >= w0 && a <= w1; };
  auto x_of = [&](std::int64_t ns) {
    return label_w + static_cast<double>(std::clamp(ns, w0, w1) - w0) / span * plot_w;
  };

  // Rows: every non-data track with something in the window (and matching
  // the actor filter), grouped by file, sorted by name.
  std::vector<bool> busy(t.tracks.size(), false);
  for (const auto& s : t.slices)
    if (in_window(s.start, s.end))
      busy[s.track] = true;
  for (const auto& x : t.transfers)
    if (in_window(x.start, x.end))
      busy[x.actor_track] = true;
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < t.tracks.size(); ++i)
    if (!t.tracks[i].data && busy[i] &&
        (options.actors.empty() || t.tracks[i].name.find(options.actors) != std::string::npos))
      order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(t.tracks[a].file, t.tracks[a].name) < std::tie(t.tracks[b].file, t.tracks[b].name);
  });
  std::vector<double> row_y(t.tracks.size(), 0);
  double y = top;
  std::vector<std::pair<double, std::size_t>> group_labels;
  for (std::size_t k = 0; k < order.size(); ++k) {
    auto i = order[k];
    if (k == 0 || t.tracks[order[k - 1]].file != t.tracks[i].file) {
      group_labels.emplace_back(y, t.tracks[i].file);
      y += group_h;
    }
    row_y[i] = y;
    y += row_h;
  }
  double rows_end = y;

  // Colours by message kind, in order of name.
  std::map<std::string, std::size_t> kinds;
  for (const auto& s : t.slices)
    kinds.emplace(s.kind.empty() ? "?" : s.kind, 0);
  std::size_t n = 0;
  for (auto& [k, c] : kinds)
    c = n++;
  const double legend_item_w = 170;
  auto per_line = std::max<std::size_t>(1, static_cast<std::size_t>((width - label_w) / legend_item_w));
  double legend_h = 30 + 18 * static_cast<double>((kinds.size() + per_line - 1) / per_line);
  double height = rows_end + legend_h + 20;

  std::string out = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  out += fmt::format("<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">troupe trace: "
                     "{} process(es), {} actor(s), {} ({:.3f} of {:.3f} ms)</text>\n",
                     files.size(), order.size(), xml(window_text), span / 1e6, static_cast<double>(t.end) / 1e6);

  // Time axis: unit chosen by the span, ticks as vertical grid lines.
  double step = tick_step(span, 10);
  auto [unit, scale] = span < 1e4 ? std::pair{"ns", 1.0}
                       : span < 1e7 ? std::pair{"us", 1e3}
                       : span < 1e10 ? std::pair{"ms", 1e6}
                                     : std::pair{"s", 1e9};
  out += "<g class=\"axis\" stroke=\"#ccc\" stroke-width=\"1\">\n";
  // Ticks at multiples of the step, labelled with the time since the trace's start.
  for (double tick = std::ceil(static_cast<double>(w0) / step) * step; tick <= static_cast<double>(w1) * 1.0001;
       tick += step) {
    double x = x_of(static_cast<std::int64_t>(tick));
    out += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.0f}\" x2=\"{0:.1f}\" y2=\"{2:.0f}\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3:.0f}\" stroke=\"none\" fill=\"#333\" "
                       "text-anchor=\"middle\" font-size=\"11\">{4:g} {5}</text>\n",
                       x, top - 8, rows_end, top - 12, tick / scale, unit);
  }
  out += "</g>\n";

  for (auto [gy, fi] : group_labels)
    out += fmt::format("<text x=\"6\" y=\"{:.0f}\" font-weight=\"bold\">{}</text>\n", gy + 14,
                       xml(process_name(files[fi])));

  // Rows: background, label, handler rectangles (sub-pixel neighbours of the
  // same kind merged so that long traces stay small), transfer bars.
  std::vector<std::vector<const slice*>> slices_of(t.tracks.size());
  for (const auto& s : t.slices)
    if (in_window(s.start, s.end))
      slices_of[s.track].push_back(&s);
  std::vector<std::vector<const transfer*>> transfers_of(t.tracks.size());
  for (const auto& x : t.transfers)
    if (in_window(x.start, x.end))
      transfers_of[x.actor_track].push_back(&x);
  for (std::size_t k = 0; k < order.size(); ++k) {
    auto i = order[k];
    double ry = row_y[i];
    out += fmt::format("<g class=\"row\" data-actor=\"{}\">\n", xml(t.tracks[i].name));
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" "
                       "fill=\"{}\"/>\n",
                       label_w, ry, plot_w, row_h, k % 2 ? "#f4f4f4" : "#fafafa");
    out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"end\">{}</text>\n",
                       label_w - 6, ry + row_h / 2 + 4, xml(t.tracks[i].name));
    double run_x1 = -1, run_x2 = -1;
    std::size_t run_kind = 0;
    bool run_span = false;
    auto flush_run = [&] {
      if (run_x1 < 0)
        return;
      double h = run_span ? row_h * 0.3 : row_h - 6;
      out += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" "
                         "fill=\"{}\"{}{}/>\n",
                         run_x1, ry + 3, std::max(0.5, run_x2 - run_x1), h, colour(run_kind),
                         run_span ? " fill-opacity=\"0.5\"" : "",
                         // a hairline edge keeps back-to-back spans of one kind apart
                         run_x2 - run_x1 > 3 ? " stroke=\"white\" stroke-width=\"0.6\"" : "");
      run_x1 = -1;
    };
    for (const auto* s : slices_of[i]) {
      auto kind = kinds.at(s->kind.empty() ? "?" : s->kind);
      double x1 = x_of(s->start), x2 = x_of(s->end);
      if (run_x1 >= 0 && kind == run_kind && s->span == run_span && x1 - run_x2 < 0.5) {
        run_x2 = std::max(run_x2, x2);
        continue;
      }
      flush_run();
      run_x1 = x1;
      run_x2 = x2;
      run_kind = kind;
      run_span = s->span;
    }
    flush_run();
    for (const auto* x : transfers_of[i])
      out += fmt::format("<rect class=\"transfer\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
                         "height=\"3\" fill=\"{}\"/>\n",
                         x_of(x->start), ry + row_h - 4,
                         std::max(0.5, x_of(x->end) - x_of(x->start)),
                         x->type == event_type::data_write ? "#222" : "#777");
    out += "</g>\n";
  }

  // Sends -> receives in the window between drawn rows, evenly sampled
  // beyond max_lines.
  std::vector<bool> drawn(t.tracks.size(), false);
  for (auto i : order)
    drawn[i] = true;
  std::vector<std::pair<std::size_t, std::size_t>> flows;
  for (auto [si, ri] : t.message_flows)
    if (drawn[t.points[si].track] && drawn[t.points[ri].track] && in_window(t.points[si].ts, t.points[ri].ts))
      flows.emplace_back(si, ri);
  out += "<g class=\"flows\" stroke=\"#222\" stroke-width=\"0.7\" stroke-opacity=\"0.45\">\n";
  std::size_t every = 1;
  if (options.max_lines > 0 && flows.size() > options.max_lines)
    every = (flows.size() + options.max_lines - 1) / options.max_lines;
  for (std::size_t k = 0; k < flows.size(); k += every) {
    auto [si, ri] = flows[k];
    const auto& s = t.points[si];
    const auto& r = t.points[ri];
    out += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.1f}\" x2=\"{:.2f}\" y2=\"{:.1f}\"/>\n",
                       x_of(s.ts), row_y[s.track] + row_h / 2, x_of(r.ts),
                       row_y[r.track] + row_h / 2);
  }
  out += "</g>\n";

  // Legend.
  double ly = rows_end + 24;
  out += fmt::format("<g class=\"legend\"><text x=\"10\" y=\"{:.0f}\" font-weight=\"bold\">message "
                     "kind</text>\n",
                     ly + 10);
  std::size_t col = 0;
  for (const auto& [k, c] : kinds) {
    double lx = label_w + static_cast<double>(col) * legend_item_w;
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n",
                       lx, ly, colour(c), lx + 16, ly + 10, xml(k));
    if (++col == per_line) {
      col = 0;
      ly += 18;
    }
  }
  if (!t.transfers.empty())
    out += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" fill=\"#444\">dark bars under a row: "
                       "data-plane writes (black) and reads (grey); lines: send to receive</text>\n",
                       label_w, ly + (col ? 28 : 10));
  out += "</g>\n</svg>\n";
  if (every > 1)
    warnings.push_back(fmt::format("svg: drew every {}th of {} send -> receive lines", every, flows.size()));
  return out;
}

} // namespace troupe::trace
