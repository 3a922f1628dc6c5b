// Convolutional network training steps, troupe beside PyTorch
// (bench/peers/cnn_step_torch.py: the same architecture, SGD with momentum,
// float32; on CUDA with TF32 off on both sides, on the CPU with one thread
// each) in interleaved rounds of the same run.
//
//   build/bench/cnn_step [--json] [--device=cpu|cuda:0] [--models=convnet] [--rounds=3] [--steps=3]
//                        [--threads=1] [--python=/usr/bin/python3] [--peer=bench/peers/cnn_step_torch.py]
//                        [--no-peers]
//
// Models: convnet, three blocks of 3 x 3 convolution (padding 1), ReLU and
// 2 x 2 max pooling with 32, 64 and 128 channels, then a linear classifier
// of 10 classes, on 32 x 32 RGB images in batches of 32 (CIFAR-10's
// shape); convnet_wide, the same with four times the channels (128, 256,
// 512) in batches of 64, meant for a GPU. The report states what ran the
// convolutions and the GEMMs on troupe's side and PyTorch's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "training_step_options.hpp"
#include "training_step_rounds.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/tensor/cpu_blas.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/intra_op_threads.hpp"

using namespace troupe;

namespace {

struct cnn_size {
  const char* name;
  std::int64_t channels; ///< of the first block; each block doubles them
  std::int64_t batch;
};

constexpr cnn_size sizes[] = {{"convnet", 32, 32}, {"convnet_wide", 128, 64}};
constexpr std::int64_t image = 32, classes = 10, blocks = 3;

/// The convolutional blocks, then the classifier, trained one SGD step at
/// a time on a fixed batch.
struct trainer {
  std::shared_ptr<nn::sequential> features = std::make_shared<nn::sequential>();
  std::shared_ptr<nn::linear> classifier;
  std::unique_ptr<optim::sgd> opt;
  std::int64_t flat = 0;

  trainer(const cnn_size& size, device where) {
    std::int64_t in = 3, out = size.channels, side = image;
    for (std::int64_t b = 0; b < blocks; ++b, in = out, out *= 2, side /= 2) {
      features->append(std::make_shared<nn::conv2d>(nn::conv2d_options{
        .in_channels = in, .out_channels = out, .kernel_size = 3, .padding = 1, .seed = static_cast<std::uint64_t>(b + 1)}));
      features->append(std::make_shared<nn::relu>());
      features->append(std::make_shared<nn::max_pool2d>(pool2d_options{2, 2}));
    }
    flat = in * side * side;
    classifier = std::make_shared<nn::linear>(nn::linear_options{.in_features = flat, .out_features = classes, .seed = 9});
    features->to(where); // before the optimizer takes the parameters
    classifier->to(where);
    auto parameters = features->named_parameters();
    for (auto& named : classifier->named_parameters())
      parameters.push_back(named);
    opt = std::make_unique<optim::sgd>(parameters, optim::sgd_options{.lr = 0.01, .momentum = 0.9});
  }

  std::int64_t parameter_count() const { return features->parameter_count() + classifier->parameter_count(); }

  /// One step; its loss (on a GPU, waiting for the step's kernels).
  double step(const tensor& images, const tensor& labels) {
    opt->zero_grad();
    auto maps = (*features)(autograd::variable(images));
    auto loss = autograd::cross_entropy((*classifier)(autograd::reshape(maps, {images.size(0), flat})), labels);
    autograd::backward(loss);
    opt->step();
    return loss.item();
  }
};

} // namespace

int main(int argc, char** argv) {
  bench::check_flags("cnn_step", argc, argv, {"device=", "models=", "rounds=", "steps=", "threads=", "python=", "peer=", "no-peers"});
  bench::report out("cnn_step", argc, argv);
  const auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 3, 1, 100));
  const auto steps = static_cast<int>(bench::int_option(argc, argv, "steps", 3, 1, 1000));
  const auto threads = static_cast<int>(bench::int_option(argc, argv, "threads", 1, 1, 256));
  set_intra_op_threads(threads);
  const auto options = bench::parse_training_step_options(
    "cnn_step", argc, argv, "convnet", {"convnet", "convnet_wide"},
    std::string(TROUPE_SOURCE_DIR) + "/bench/peers/cnn_step_torch.py");
  if (!options)
    return 2;
  const auto& [device_name, where, models, python, peer_script, peers] = *options;
  if (bench::said_no_device(*options, out))
    return 0;
  if (where.kind == device_kind::cuda)
    out.note("troupe's conv2d on CUDA: {}", cuda_convolution());
  else
    out.note("troupe's conv2d on the CPU: im2col and float32 GEMM by {}", float32_gemm());

  for (const auto& size : sizes) {
    if (!options->wants(size.name))
      continue;
    generator data{7};
    // One fixed batch: the loss must fall on it (the correctness column).
    auto images = randn({size.batch, 3, image, image}, data, 0.0, 1.0, dtype::float32, where);
    auto labels = randint({size.batch}, data, 0, classes, where);
    trainer main_run(size, where);
    auto train_step = [&] { return main_run.step(images, labels); };

    std::optional<bench::peer_process> torch;
    if (peers)
      torch.emplace(std::vector<std::string>{python, peer_script, std::to_string(size.channels),
                                             std::to_string(size.batch), device_name, std::to_string(threads)});
    const auto ready = torch && torch->started() ? torch->read_line(300'000).value_or("") : std::string();
    const bool have_peer = ready.find("ready") != std::string::npos;
    if (auto said = bench::json_string(ready, "convolution"))
      out.note("PyTorch's conv2d for {}: {}", size.name, *said);
    if (peers && !have_peer)
      out.note("PyTorch peer unavailable for {} on {} (needs torch under {}); troupe alone", size.name, device_name, python);

    const auto case_name = fmt::format("{} (channels {}-{}, batch {}) {:.2f}M params", size.name, size.channels,
                                       size.channels * 4, size.batch,
                                       static_cast<double>(main_run.parameter_count()) / 1e6);
    auto result = bench::time_training_steps(train_step, have_peer ? &*torch : nullptr, rounds, steps, case_name,
                                             static_cast<double>(size.batch), where, threads, out);
    out.add(result.samples);
  }
  out.print();
}
