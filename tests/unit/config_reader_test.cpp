// Run descriptions: every layer and option of a YAML (or JSON) file parses into the LayerSpec and
// settings a C++ user writes by hand; a model and optimizer built from a file take the same
// steps, bit for bit, as ones built by hand; every kind of bad file is an error naming the file,
// the key path and the line.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <dtrain/config/build.hpp>
#include <dtrain/config/run_config.hpp>

namespace {

using namespace dtrain;

// Every field of a layer description, written from the structs themselves (independent of the
// reader), so that two lists compare equal exactly when every option matches.
std::string describe(const std::vector<LayerSpec>& layers);
std::string describe(const LayerSpec& l) {
  std::ostringstream os;
  os.precision(17);
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, Input>)
          os << "input" << to_string(s.shape);
        else if constexpr (std::is_same_v<S, Linear>)
          os << "linear(" << s.in_features << "," << s.out_features << "," << int(s.init) << ")";
        else if constexpr (std::is_same_v<S, Relu>)
          os << "relu";
        else if constexpr (std::is_same_v<S, Gelu>)
          os << "gelu";
        else if constexpr (std::is_same_v<S, Tanh>)
          os << "tanh";
        else if constexpr (std::is_same_v<S, LayerNorm>)
          os << "layer_norm(" << s.features << "," << s.eps << ")";
        else if constexpr (std::is_same_v<S, Dropout>)
          os << "dropout(" << s.p << ")";
        else if constexpr (std::is_same_v<S, Conv>)
          os << "conv(" << s.dims << "," << s.in_channels << "," << s.out_channels << ","
             << s.kernel << "," << s.stride << "," << s.padding << "," << s.dilation << ","
             << int(s.padding_mode) << "," << int(s.weight_init) << "," << int(s.lowering) << ")";
        else if constexpr (std::is_same_v<S, Pool>)
          os << "pool(" << int(s.kind) << "," << s.dims << "," << s.kernel << "," << s.stride
             << ")";
        else if constexpr (std::is_same_v<S, Upsample>)
          os << "upsample(" << s.dims << "," << s.scale << ")";
        else if constexpr (std::is_same_v<S, Residual<>>)
          os << "residual[" << describe(s.body) << "]";
      },
      l.base());
  return os.str();
}
std::string describe(const std::vector<LayerSpec>& layers) {
  std::string s;
  for (const auto& l : layers) s += describe(l) + ";";
  return s;
}

// The error message of parsing `text` as "t.yaml" (empty when it parses).
std::string error_of(const std::string& text) {
  try {
    parse_run_config(text, "t.yaml");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

bool same_bits(BufferView a, BufferView b) {
  return a.count == b.count && a.dtype == b.dtype &&
         std::memcmp(a.data, b.data, a.count * size_of(a.dtype)) == 0;
}

}  // namespace

TEST_CASE("every layer kind and option parses into the LayerSpec written by hand") {
  const RunConfig run = parse_run_config(R"(
model:
  layers:
    - input: [3, 8, 8]
    - conv2d: {in: 3, out: 4, kernel: 3, stride: 2, padding: 1, padding_mode: periodic,
               dilation: 1, init: xavier_normal, lowering: im2col}
    - conv1d: {in: 4, out: 4, kernel: 1}
    - conv3d: {in: 4, out: 4, kernel: 2, dilation: 2, padding: 0, padding_mode: zeros,
               init: kaiming_normal, lowering: direct}
    - relu
    - gelu: {}
    - tanh:
    - layer_norm: {features: 16, eps: 1.0e-6}
    - dropout: {p: 0.25}
    - max_pool1d: {kernel: 2}
    - max_pool2d: {kernel: 3, stride: 1}
    - max_pool3d: {kernel: 2}
    - avg_pool1d: {kernel: 2}
    - avg_pool2d: {kernel: 2, stride: 2}
    - avg_pool3d: {kernel: 1}
    - upsample1d: {scale: 2}
    - upsample2d: {scale: 3}
    - upsample3d: {scale: 1}
    - residual:
        - conv2d: {in: 4, out: 4, kernel: 3, padding: 1, lowering: shifted}
        - residual: [relu, {linear: {in: 4, out: 4}}]
    - linear: {in: 64, out: 10, init: xavier_uniform}
    - linear: {in: 10, out: 2, init: kaiming_uniform}
)");
  const std::vector<LayerSpec> hand{
      Input{3, 8, 8},
      Conv2d(3, 4, 3)
          .with_stride(2)
          .with_padding(1, dtrain::Padding::periodic)
          .with_dilation(1)
          .with_init(Init::xavier_normal)
          .with_lowering(ConvLowering::im2col),
      Conv1d(4, 4, 1),
      Conv3d(4, 4, 2)
          .with_dilation(2)
          .with_padding(0)
          .with_init(Init::kaiming_normal)
          .with_lowering(ConvLowering::direct),
      Relu{},
      Gelu{},
      Tanh{},
      LayerNorm(16, 1e-6),
      Dropout(0.25f),
      MaxPool1d(2),
      MaxPool2d(3, 1),
      MaxPool3d(2),
      AvgPool1d(2),
      AvgPool2d(2, 2),
      AvgPool3d(1),
      Upsample1d(2),
      Upsample2d(3),
      Upsample3d(1),
      Residual{Conv2d(4, 4, 3).with_padding(1).with_lowering(ConvLowering::shifted),
               Residual{Relu{}, Linear(4, 4)}},
      Linear(64, 10, Init::xavier_uniform),
      Linear(10, 2, Init::kaiming_uniform)};
  CHECK(describe(run.layers) == describe(hand));
  // What the file leaves out takes the documented defaults.
  const RunConfig d = parse_run_config("model: {layers: [{linear: {in: 2, out: 3}}]}");
  const RunConfig empty;
  CHECK(d.seed == 0);
  CHECK(d.dtype == DType::f32);
  CHECK(d.loss == Loss::softmax_cross_entropy);
  CHECK(d.optimizer.kind == OptimizerKind::adamw);
  CHECK(d.optimizer.schedule.describe() == empty.optimizer.schedule.describe());
  CHECK(d.sync.mode == SyncMode::replicated);
  CHECK(d.sync.bucket_bytes == empty.sync.bucket_bytes);
  CHECK(d.checkpoint.directory.empty());
  CHECK(d.checkpoint.options.keep_last == CheckpointOptions{}.keep_last);
  CHECK(d.source == "<text>");
}

TEST_CASE("optimizer, schedule, sync and checkpoint settings parse into the library's options") {
  const std::string text = R"(seed: 18446744073709551615
model:
  dtype: f64
  layers: [{linear: {in: 2, out: 2}}]
loss: mse
optimizer:
  kind: sgd
  schedule: {kind: step, lr: 0.5, step_size: 10, gamma: 0.5}
  momentum: 0.9
  dampening: 0
  weight_decay: 1e-4
  nesterov: true
  clip_grad_norm: 2.5
sync: {mode: sharded, bucket_bytes: 65536, algorithm: ring, reproducible: true}
checkpoint:
  directory: run/ckpt
  every_steps: 100
  every_seconds: 600
  keep_last: 2
  async: true
  prefix: state
  strategy: parallel_slices
  restore: distributed
  levels: {local_dir: /dev/shm/job, local_every: 10, partner: false, shared_every: 5,
           transfer_timeout_seconds: 30}
)";
  const RunConfig r = parse_run_config(text, "a.yaml");
  CHECK(r.source == "a.yaml");
  CHECK(r.text == text);
  CHECK(r.seed == 18446744073709551615ull);
  CHECK(r.dtype == DType::f64);
  CHECK(r.loss == Loss::mse);
  CHECK(r.optimizer.kind == OptimizerKind::sgd);
  CHECK(r.optimizer.schedule.describe() == Schedule::step_decay(0.5, 10, 0.5).describe());
  CHECK(r.optimizer.sgd.momentum == 0.9);
  CHECK(r.optimizer.sgd.dampening == 0);
  CHECK(r.optimizer.sgd.weight_decay == 1e-4);
  CHECK(r.optimizer.sgd.nesterov);
  CHECK(r.optimizer.clip_grad_norm == 2.5);
  CHECK(r.sync.mode == SyncMode::sharded);
  CHECK(r.sync.bucket_bytes == 65536);
  CHECK(r.sync.algorithm == AllreduceAlgorithm::ring);
  CHECK(r.sync.reproducible);
  CHECK(comm_config(r, CommConfig{}).reproducible);
  const CheckpointOptions& c = r.checkpoint.options;
  CHECK(r.checkpoint.directory == "run/ckpt");
  CHECK(c.every_steps == 100);
  CHECK(c.every_seconds == 600);
  CHECK(c.keep_last == 2);
  CHECK(c.async);
  CHECK(c.prefix == "state");
  CHECK(c.strategy == CheckpointStrategy::parallel_slices);
  CHECK(c.restore == RestoreStrategy::distributed);
  CHECK(c.levels.local_dir == "/dev/shm/job");
  CHECK(c.levels.local_every == 10);
  CHECK_FALSE(c.levels.partner);
  CHECK(c.levels.shared_every == 5);
  CHECK(c.levels.transfer_timeout_seconds == 30);
  CHECK(checkpoint_options(r).config == text);

  const RunConfig a = parse_run_config(R"(
model: {layers: [{linear: {in: 2, out: 2}}]}
optimizer:
  kind: adamw
  schedule: {kind: warmup_cosine, peak: 3e-3, warmup_steps: 5, total_steps: 50, min_lr: 1e-5}
  beta1: 0.8
  beta2: 0.99
  eps: 1e-7
  weight_decay: 0
  clip_grad_norm: 1
sync: {mode: fully_sharded, unit_bytes: 4096, buffers: 3, prefetch: false}
)");
  CHECK(a.optimizer.schedule.describe() == Schedule::warmup_cosine(3e-3, 5, 50, 1e-5).describe());
  CHECK(a.optimizer.adamw.beta1 == 0.8);
  CHECK(a.optimizer.adamw.beta2 == 0.99);
  CHECK(a.optimizer.adamw.eps == 1e-7);
  CHECK(a.optimizer.adamw.weight_decay == 0);
  CHECK(a.sync.mode == SyncMode::fully_sharded);
  const FullyShardedOptions f = fully_sharded_options(a);
  CHECK(f.unit_bytes == 4096);
  CHECK(f.buffers == 3);
  CHECK_FALSE(f.prefetch);
  CHECK(f.max_grad_norm == 1);
  // lr is the constant schedule's shorthand.
  CHECK(parse_run_config("model: {layers: [{linear: {in: 1, out: 1}}]}\noptimizer: {lr: 0.25}")
            .optimizer.schedule.describe() == Schedule::constant(0.25).describe());
}

TEST_CASE("a JSON file reads as the same run as its YAML form") {
  const RunConfig y = parse_run_config(R"(
seed: 7
model:
  layers: [{input: [4]}, {linear: {in: 4, out: 3}}, relu, {dropout: {p: 0.5}}]
optimizer: {kind: sgd, lr: 0.1, momentum: 0.5}
)");
  const RunConfig j = parse_run_config(R"({
  "seed": 7,
  "model": {"layers": [{"input": [4]}, {"linear": {"in": 4, "out": 3}}, "relu",
                       {"dropout": {"p": 0.5}}]},
  "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.5}
})");
  CHECK(describe(j.layers) == describe(y.layers));
  CHECK(j.seed == 7);
  CHECK(j.optimizer.kind == OptimizerKind::sgd);
  CHECK(j.optimizer.sgd.momentum == 0.5);
  CHECK(j.optimizer.schedule.describe() == y.optimizer.schedule.describe());
  // A JSON string where a number belongs is a wrong type, not a number.
  CHECK(
      error_of(R"({"seed": "7", "model": {"layers": ["relu"]}})").find("found the string \"7\"") !=
      std::string::npos);
}

TEST_CASE("a model and optimizer built from a file take the same step as ones built by hand") {
  const RunConfig run = parse_run_config(R"(
seed: 1234
model:
  layers:
    - input: [2, 6, 6]
    - conv2d: {in: 2, out: 3, kernel: 3, padding: 1, padding_mode: periodic}
    - gelu
    - residual:
        - conv2d: {in: 3, out: 3, kernel: 3, padding: 1}
        - tanh
    - avg_pool2d: {kernel: 2}
    - linear: {in: 27, out: 4, init: xavier_uniform}
    - layer_norm: {features: 4}
optimizer:
  kind: adamw
  schedule: {kind: warmup_cosine, peak: 1e-2, warmup_steps: 2, total_steps: 10}
  weight_decay: 0.05
)");
  auto from_file = make_model<float>(run);
  auto opt_file = make_optimizer<AdamW>(from_file, run.optimizer);

  Sequential by_hand{Input{2, 6, 6}, Conv2d(2, 3, 3).with_padding(1, dtrain::Padding::periodic),
                     Gelu{},         Residual{Conv2d(3, 3, 3).with_padding(1), Tanh{}},
                     AvgPool2d(2),   Linear(27, 4, Init::xavier_uniform),
                     LayerNorm(4)};
  by_hand.init(1234);
  AdamWOptions o;
  o.weight_decay = 0.05;
  AdamW opt_hand(by_hand, Schedule::warmup_cosine(1e-2, 2, 10), o);

  REQUIRE(from_file.parameter_count() == by_hand.parameter_count());
  CHECK(same_bits(from_file.parameters(), by_hand.parameters()));
  std::vector<float> x(2 * 72);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) * 0.25f - 0.7f;
  const std::vector<std::int32_t> labels{1, 3};
  for (int step = 0; step < 2; ++step) {
    from_file.zero_grad();
    by_hand.zero_grad();
    const double lf = from_file.forward_backward(x.data(), labels.data(), 2).get();
    const double lh = by_hand.forward_backward(x.data(), labels.data(), 2).get();
    CHECK(lf == lh);
    opt_file.step();
    opt_hand.step();
  }
  CHECK(same_bits(from_file.parameters(), by_hand.parameters()));
  // The parameters moved: the comparison above is not of two untouched models.
  Sequential fresh{Input{2, 6, 6}, Conv2d(2, 3, 3).with_padding(1, dtrain::Padding::periodic),
                   Gelu{},         Residual{Conv2d(3, 3, 3).with_padding(1), Tanh{}},
                   AvgPool2d(2),   Linear(27, 4, Init::xavier_uniform),
                   LayerNorm(4)};
  fresh.init(1234);
  CHECK_FALSE(same_bits(from_file.parameters(), fresh.parameters()));

  // The described dtype and optimizer kind are enforced.
  CHECK_THROWS_AS(make_model<double>(run), InvalidArgument);
  CHECK_THROWS_AS(make_optimizer<Sgd>(from_file, run.optimizer), InvalidArgument);
  // Layers that do not fit together: the model's own check, with the file named.
  const RunConfig bad =
      parse_run_config("model: {layers: [{input: [5]}, {linear: {in: 4, out: 2}}]}", "bad.yaml");
  try {
    make_model<float>(bad);
    FAIL("a layer list whose shapes do not fit was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("bad.yaml: model.layers:") != std::string::npos);
  }
}

TEST_CASE("bad files are errors naming the file, the key path, the line, found and expected") {
  struct Case {
    const char* text;
    std::vector<const char*> expect;
  };
  const std::vector<Case> cases{
      // unknown key, at every level
      {"model: {layers: [relu]}\nfoo: 1", {"t.yaml:2:1: foo: unknown key 'foo'", "accepts: seed"}},
      {"model:\n  layers:\n    - conv2d: {in: 1, out: 2, kernel: 3, strides: 2}",
       {"t.yaml:3:", "model.layers[0].conv2d.strides: unknown key 'strides'", "stride"}},
      {"model: {layers: [relu]}\noptimizer: {kind: sgd, beta1: 0.9}",
       {"t.yaml:2:", "optimizer.beta1: unknown key"}},
      {"model: {layers: [relu]}\nsync: {mode: fully_sharded, bucket_bytes: 64}",
       {"t.yaml:2:", "sync.bucket_bytes: unknown key"}},
      {"model: {layers: [relu]}\ncheckpoint: {levels: {local_dirs: /tmp}}",
       {"t.yaml:2:", "checkpoint.levels.local_dirs: unknown key"}},
      {"model: {layers: [relu, {bogus: {}}]}",
       {"t.yaml:1:", "model.layers[1]: unknown layer kind 'bogus'"}},
      // wrong type
      {"seed: [1]\nmodel: {layers: [relu]}",
       {"t.yaml:1:7: seed: found a list, expected an integer"}},
      {"model: {layers: [relu]}\nsync: {reproducible: 1}",
       {"t.yaml:2:", "sync.reproducible: found '1', expected true or false"}},
      {"model: {layers: relu}",
       {"t.yaml:1:", "model.layers: found 'relu', expected a non-empty list"}},
      {"model:\n  layers:\n    - linear: {in: 2.5, out: 2}",
       {"t.yaml:3:", "model.layers[0].linear.in: found '2.5', expected an integer >= 1"}},
      {"model: {layers: [[relu]]}", {"model.layers[0]: found a list, expected a layer"}},
      // bad value
      {"model:\n  layers:\n    - relu\n    - conv3d: {in: 1, out: 2, kernel: 3, stride: 0}",
       {"t.yaml:4:", "model.layers[1].conv3d.stride: found '0', expected an integer >= 1"}},
      {"model: {layers: [{dropout: {p: 1}}]}",
       {"model.layers[0].dropout.p: found '1', expected a number in [0, 1)"}},
      {"model: {layers: [relu]}\nloss: l1",
       {"t.yaml:2:7: loss: found 'l1', expected one of softmax_cross_entropy | mse"}},
      {"model: {layers: [relu]}\noptimizer: {kind: lbfgs}", {"optimizer.kind: found 'lbfgs'"}},
      {"model: {layers: [relu]}\nsync: {algorithm: fastest}",
       {"sync.algorithm:", "unknown all-reduce algorithm 'fastest'"}},
      {"model: {layers: [relu]}\noptimizer: {schedule: {kind: warmup_cosine, peak: 1, "
       "warmup_steps: 9, total_steps: 9}}",
       {"t.yaml:2:", "optimizer.schedule:", "warmup_steps < total_steps"}},
      {"model: {layers: [relu, {input: [3]}]}",
       {"model.layers[1].input: input may only be the first"}},
      {"model: {layers: [{input: [3, 0]}]}", {"model.layers[0].input[1]: found '0'"}},
      {"model: {dtype: f16, layers: [relu]}",
       {"model.dtype: found 'f16', expected one of f32 | f64"}},
      {"model: {layers: [relu]}\noptimizer: {lr: 0.1, schedule: {kind: constant, lr: 0.2}}",
       {"optimizer.schedule: give either lr"}},
      {"model: {layers: [relu]}\ncheckpoint: {keep_last: 0}", {"checkpoint.keep_last: found '0'"}},
      {"seed: -1\nmodel: {layers: [relu]}", {"seed: found '-1'"}},
      {"seed: 1\nseed: 2\nmodel: {layers: [relu]}",
       {"t.yaml:2:1: seed: key 'seed' is given twice"}},
      // missing required key
      {"seed: 1", {"t.yaml:1:1: model: missing required key 'model'"}},
      {"model: {dtype: f32}", {"model.layers: missing required key 'layers'"}},
      {"model:\n  layers:\n    - linear: {in: 3}",
       {"t.yaml:3:", "model.layers[0].linear.out: missing required key 'out'"}},
      {"model:\n  layers:\n    - relu\n    - conv2d",
       {"t.yaml:4:", "model.layers[1].conv2d.in: missing required key"}},
      {"model: {layers: [relu]}\noptimizer: {schedule: {kind: step, lr: 1}}",
       {"optimizer.schedule.step_size: missing required key"}},
      // malformed YAML, empty or several documents
      {"model: {layers: [relu}", {"t.yaml:1:", "malformed YAML"}},
      {"model:\n  layers: [relu]\n bad indent: 1", {"t.yaml:3:", "malformed YAML"}},
      {"", {"t.yaml: found nothing, expected a mapping"}},
      {"model: {layers: [relu]}\n---\nseed: 1",
       {"t.yaml:2:1: found more after the end of the first YAML document"}},
      {"model: {layers: [relu]}\n,", {"t.yaml:2:1: malformed YAML"}},
      // yaml-cpp's LoadAll never returns on this one (a stray token after the document)
      {"{model: {layers: [relu]}},", {"t.yaml:1:", "found more after the end of the first YAML"}},
  };
  for (const Case& c : cases) {
    CAPTURE(std::string(c.text));
    const std::string e = error_of(c.text);
    CHECK(e.rfind("dtrain: rank ", 0) == 0);
    for (const char* part : c.expect) {
      CAPTURE(std::string(part));
      CAPTURE(e);
      CHECK(e.find(part) != std::string::npos);
    }
  }
}

TEST_CASE("read_run_config reads a file and names it in errors") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dtrain-config-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.yaml").string(), bad = (dir / "bad.yaml").string();
  std::ofstream(good) << "seed: 3\nmodel: {layers: [{linear: {in: 2, out: 2}}]}\n";
  std::ofstream(bad) << "seed: 3\nmodel:\n  layers: [{linear: {in: 2, out: -2}}]\n";
  const RunConfig r = read_run_config(good);
  CHECK(r.source == good);
  CHECK(r.seed == 3);
  CHECK(r.text == "seed: 3\nmodel: {layers: [{linear: {in: 2, out: 2}}]}\n");
  try {
    read_run_config(bad);
    FAIL("a negative feature count was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find(bad + ":3:") != std::string::npos);
    CHECK(std::string(e.what()).find("model.layers[0].linear.out: found '-2'") !=
          std::string::npos);
  }
  CHECK_THROWS_AS(read_run_config((dir / "missing.yaml").string()), IoError);
  CHECK_THROWS_AS(read_run_config(dir.string()), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the example run descriptions read and build") {
  // docs/configuration.md shows complete.yaml as it is (without its leading comment lines).
  const std::string src(DTRAIN_SOURCE_DIR);
  std::ifstream page(src + "/docs/configuration.md"), file(src + "/examples/configs/complete.yaml");
  std::string line, shown, kept;
  bool in_block = false, done = false;
  while (!done && std::getline(page, line)) {
    if (in_block && line == "```")
      done = true;
    else if (in_block)
      shown += line + "\n";
    else if (line == "```yaml")
      in_block = true;
  }
  while (std::getline(file, line))
    if (!(kept.empty() && line.rfind("#", 0) == 0)) kept += line + "\n";
  CHECK(done);
  CHECK(shown == kept);

  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(DTRAIN_SOURCE_DIR) + "/examples/configs")) {
    CAPTURE(entry.path().string());
    const RunConfig run = read_run_config(entry.path().string());
    if (run.dtype == DType::f32)
      CHECK(make_model<float>(run).parameter_count() > 0);
    else
      CHECK(make_model<double>(run).parameter_count() > 0);
  }
}
