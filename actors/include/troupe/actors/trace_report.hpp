#pragma once
// What the trace tool makes of a set of trace files: Chrome trace-event JSON,
// a summary, and an SVG timeline.
//
// All three place every record on one timeline: a record's steady-clock time
// is mapped to its host's system clock by the file's start-up pair and then
// shifted by the file's clock offset (trace_file::global_ns); times are shown
// relative to the earliest record of all files.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "troupe/actors/trace_reader.hpp"

namespace troupe::trace {

/// Chrome trace-event JSON (Perfetto, chrome://tracing): a process per file
/// ("node (pid N)"), a thread track per actor (plus "<actor> data" for its
/// data-plane transfers), handlers and spans as complete ("X") events named by
/// message kind, sends and receives as instant events, flow events ("s" at the
/// send, binding to the enclosing handler; "f" at the receive, binding to the
/// next slice, i.e. the handler that takes the message) from each send to its
/// receive and from each data-plane write to its read, counters as "C".
/// `warnings` receives pairing problems (a handler end without a start, ...).
std::string chrome_trace_json(std::span<const trace_file> files, std::vector<std::string>& warnings);

/// Per actor.
struct actor_summary {
  std::string node;
  std::string actor;
  std::uint64_t handled = 0;         ///< handler invocations
  double busy_ns = 0;                ///< union of its handler intervals
  double span_ns = 0;                ///< its file's first to last record
  double busy_fraction = 0;          ///< busy / span
  std::optional<double> bubble_fraction; ///< see trace_summary
};

/// Per sender -> receiver edge, by actor name.
struct edge_summary {
  std::string sender;
  std::string receiver;
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;
  std::uint64_t matched = 0; ///< messages whose send and receive were both traced
  double p50_ns = 0, p90_ns = 0, p99_ns = 0; ///< send -> receive latency, nearest rank
};

/// Definitions:
/// - busy fraction: union of an actor's handler intervals over its process's
///   span (first to last record of the file).
/// - edges count sent messages, plus received messages whose send is not in
///   the trace (untraced sender or flow id 0).
/// - latency percentiles: nearest rank (the ceil(p/100 * n)-th smallest) of
///   receive time minus send time over the edge's matched flow ids.
/// - bubble fraction (when handlers carry step numbers): a step's span is
///   from its first handler start to its last handler end across all actors;
///   an actor's bubble is 1 - (its handler time in steps it took part in) /
///   (sum of those steps' spans).
/// - communication hidden behind compute: over all data-plane transfers with
///   a duration, the share of transfer time that overlaps handler execution
///   of another actor on the same node (a transfer an actor waits for in its
///   own handler is not hidden).
/// - gradient reduction hidden behind backward (data parallelism): over all
///   handlers of kind "allreduce", the share of their time that overlaps a
///   "backward" handler in the same process.
struct trace_summary {
  std::vector<actor_summary> actors;
  std::vector<edge_summary> edges;
  std::uint64_t messages = 0;
  std::uint64_t message_bytes = 0;
  std::uint64_t data_write_bytes = 0;
  std::uint64_t data_read_bytes = 0;
  std::uint64_t dropped = 0;
  double span_ns = 0; ///< first to last record over all files
  std::optional<double> hidden_communication; ///< share in [0, 1]
  std::optional<double> hidden_reduction;     ///< share in [0, 1]; none without "allreduce" handlers
  std::size_t files = 0;
};

trace_summary summarize(std::span<const trace_file> files, std::vector<std::string>& warnings);

/// A plain-text report (tables).
std::string format_summary(const trace_summary& summary);

/// The same as JSON.
std::string summary_json(const trace_summary& summary);

struct svg_options {
  int width = 1400;            ///< pixels, labels included
  std::size_t max_lines = 3000; ///< send -> receive lines drawn at most (evenly sampled)
  /// The window drawn: the last `last_steps` training steps (from the step
  /// numbers messages carry), so that a schedule is readable rather than a
  /// hundred steps squeezed into a blur; 0, or a trace without steps: the
  /// whole run. An explicit [from_ms, to_ms) (since the trace's start)
  /// overrides it.
  std::uint32_t last_steps = 2;
  std::optional<double> from_ms, to_ms;
  /// Only actors whose name contains this text (empty: all). Actors with
  /// nothing in the window are left out either way.
  std::string actors;
};

/// An SVG timeline: a row per actor (grouped by process), handler spans as
/// rectangles coloured by message kind with a legend, data-plane transfers
/// as thin dark bars under them, sends -> receives as thin lines, a time axis.
/// Each row is a `<g class="row" data-actor="...">`.
std::string render_svg(std::span<const trace_file> files, const svg_options& options,
                       std::vector<std::string>& warnings);

} // namespace troupe::trace
