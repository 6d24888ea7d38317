// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the YAML reader behind read_run_config. Every mapping is read against the list of keys
// it accepts, every scalar against the type it must have, so an unknown key, a wrong type or a
// value out of range is an error naming the file, the key path, the line and column, what was
// found and what was expected. Layer values are then checked by the layers' own constructors.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <dtrain/config/run_config.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain {
namespace detail {

class RunConfigReader {
 public:
  RunConfigReader(std::string operation, std::string source)
      : op_(std::move(operation)), source_(std::move(source)) {}

  RunConfig read(const std::string& text) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
      after_first_document(text);
    } catch (const YAML::Exception& e) {
      fail(e.mark, "", "malformed YAML: " + e.msg);
    }
    if (!root.IsMap()) fail(root, "", root, "a mapping with at least the key model");

    RunConfig run;
    run.source = source_;
    run.text = text;
    Map top(*this, root, "", {"seed", "model", "loss", "optimizer", "sync", "checkpoint"});
    if (auto n = top.get("seed")) run.seed = unsigned_integer(n, top.path("seed"));
    const YAML::Node model = top.require("model");
    read_model(model, "model", run);
    if (auto n = top.get("loss"))
      run.loss = choose<Loss>(
          n, "loss", {{"softmax_cross_entropy", Loss::softmax_cross_entropy}, {"mse", Loss::mse}});
    if (auto n = top.get("optimizer")) read_optimizer(n, "optimizer", run.optimizer);
    if (auto n = top.get("sync")) read_sync(n, "sync", run.sync);
    if (auto n = top.get("checkpoint")) read_checkpoint(n, "checkpoint", run.checkpoint);
    if (run.sync.mode == SyncMode::fully_sharded)
      run.sync.fully_sharded.max_grad_norm = run.optimizer.clip_grad_norm;
    run.checkpoint.options.config = run.text;
    return run;
  }

 private:
  // The most layers one file may describe (aliases can repeat a residual body exponentially).
  static constexpr std::size_t max_layers = 100000;

  // Events of a parse that only note where the second document starts.
  struct DocumentMarks final : YAML::EventHandler {
    YAML::Mark start = YAML::Mark::null_mark();
    void OnDocumentStart(const YAML::Mark& m) override { start = m; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  };

  // A file holds one document: anything after it (a second document, or a stray token) is an
  // error. Parsed event by event, at most two documents, rather than with YAML::LoadAll, which in
  // yaml-cpp up to 0.8.0 loops without end, allocating, on a stray token after a document
  // (e.g. a trailing ','; jbeder/yaml-cpp pull request 1319).
  void after_first_document(const std::string& text) const {
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentMarks marks;
    if (!parser.HandleNextDocument(marks)) return;
    if (parser.HandleNextDocument(marks))
      fail(marks.start, "",
           "found more after the end of the first YAML document (a second document or a stray "
           "token), expected one document");
  }

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& path,
                         const std::string& what) const {
    std::ostringstream os;
    os << source_;
    if (!mark.is_null()) os << ':' << mark.line + 1 << ':' << mark.column + 1;
    os << ": ";
    if (!path.empty()) os << path << ": ";
    os << what;
    raise<InvalidArgument>(op_, os.str());
  }
  [[noreturn]] void fail(const YAML::Node& at, const std::string& path,
                         const std::string& what) const {
    fail(at.Mark(), path, what);
  }
  [[noreturn]] void fail(const YAML::Node& at, const std::string& path, const YAML::Node& found,
                         const std::string& expected) const {
    fail(at.Mark(), path, "found " + describe(found) + ", expected " + expected);
  }

  static bool quoted(const YAML::Node& n) { return n.Tag() == "!"; }

  static std::string describe(const YAML::Node& n) {
    if (!n.IsDefined() || n.IsNull()) return "nothing";
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return n.size() ? "a list" : "an empty list";
    std::string s = n.Scalar();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return quoted(n) ? "the string \"" + s + "\"" : "'" + s + "'";
  }

  // One mapping, read against the keys it accepts (duplicates and unknown keys are errors).
  class Map {
   public:
    /// `at`: where errors about missing keys point when `node` is absent (a layer without
    /// options).
    Map(const RunConfigReader& r, const YAML::Node& node, std::string where,
        std::initializer_list<const char*> accepted, const YAML::Node& at = YAML::Node())
        : r_(r), node_(node.IsDefined() && !node.IsNull() ? node : at), path_(std::move(where)) {
      // `key:` with nothing, or a layer kind without options: every member takes its default.
      if (!node.IsDefined() || node.IsNull()) return;
      if (!node.IsMap()) r.fail(node, path_, node, "a mapping");
      for (const auto& kv : node) {
        const YAML::Node& k = kv.first;
        if (!k.IsScalar()) r.fail(k, path_, k, "a key");
        const std::string& key = k.Scalar();
        bool known = false;
        std::string list;
        for (const char* a : accepted) {
          known = known || key == a;
          list += list.empty() ? a : std::string(", ") + a;
        }
        if (!known)
          r.fail(k, path(key),
                 "unknown key '" + key + "' (" + (path_.empty() ? "top level" : path_) +
                     " accepts: " + list + ")");
        if (!values_.emplace(key, kv.second).second)
          r.fail(k, path(key), "key '" + key + "' is given twice");
      }
    }
    /// The value of `key`, or an undefined node when it is absent.
    YAML::Node get(const std::string& key) const {
      const auto it = values_.find(key);
      return it == values_.end() ? YAML::Node(YAML::NodeType::Undefined) : it->second;
    }
    bool has(const std::string& key) const { return values_.count(key) != 0; }
    YAML::Node require(const std::string& key) const {
      if (!has(key)) r_.fail(node_, path(key), "missing required key '" + key + "'");
      return get(key);
    }
    std::string path(const std::string& key) const {
      return path_.empty() ? key : path_ + "." + key;
    }
    const YAML::Node& node() const { return node_; }

   private:
    const RunConfigReader& r_;
    YAML::Node node_;
    std::string path_;
    std::map<std::string, YAML::Node> values_;
  };

  // --- scalars --------------------------------------------------------------------------------

  const std::string& plain(const YAML::Node& n, const std::string& path,
                           const std::string& expected) const {
    if (!n.IsScalar() || quoted(n)) fail(n, path, n, expected);
    return n.Scalar();
  }

  std::int64_t integer(const YAML::Node& n, const std::string& path,
                       std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                       std::int64_t hi = std::numeric_limits<std::int64_t>::max()) const {
    std::ostringstream expected;
    expected << "an integer";
    if (lo != std::numeric_limits<std::int64_t>::min() &&
        hi != std::numeric_limits<std::int64_t>::max())
      expected << " in [" << lo << ", " << hi << "]";
    else if (lo != std::numeric_limits<std::int64_t>::min())
      expected << " >= " << lo;
    const std::string& s = plain(n, path, expected.str());
    std::int64_t v = 0;
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (b != e && *b == '+') ++b;
    const auto res = std::from_chars(b, e, v);
    if (res.ec != std::errc() || res.ptr != e || b == e || v < lo || v > hi)
      fail(n, path, n, expected.str());
    return v;
  }

  std::uint64_t unsigned_integer(const YAML::Node& n, const std::string& path) const {
    const char* expected = "an integer in [0, 18446744073709551615]";
    const std::string& s = plain(n, path, expected);
    std::uint64_t v = 0;
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (b != e && *b == '+') ++b;
    const auto res = std::from_chars(b, e, v);
    if (res.ec != std::errc() || res.ptr != e || b == e) fail(n, path, n, expected);
    return v;
  }

  double real(const YAML::Node& n, const std::string& path, double lo, double hi,
              bool open_lo = false) const {
    std::ostringstream expected;
    expected << "a finite number";
    if (open_lo && hi == std::numeric_limits<double>::max())
      expected << " > " << lo;
    else if (hi == std::numeric_limits<double>::max())
      expected << " >= " << lo;
    else
      expected << " in " << (open_lo ? "(" : "[") << lo << ", " << hi << "]";
    const std::string& s = plain(n, path, expected.str());
    // strtod, not from_chars: a plain double parse, no locale in the numbers YAML writes.
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    const bool whole = !s.empty() && end == s.c_str() + s.size() && errno == 0;
    if (!whole || !std::isfinite(v) || v < lo || v > hi || (open_lo && v == lo))
      fail(n, path, n, expected.str());
    return v;
  }
  double below_one(const YAML::Node& n, const std::string& path) const {
    const double v = real(n, path, 0.0, 1.0);
    if (v >= 1.0) fail(n, path, n, "a number in [0, 1)");
    return v;
  }
  double nonnegative(const YAML::Node& n, const std::string& path) const {
    return real(n, path, 0.0, std::numeric_limits<double>::max());
  }

  bool boolean(const YAML::Node& n, const std::string& path) const {
    const std::string& s = plain(n, path, "true or false");
    if (s == "true") return true;
    if (s == "false") return false;
    fail(n, path, n, "true or false");
  }

  std::string string(const YAML::Node& n, const std::string& path) const {
    if (!n.IsScalar()) fail(n, path, n, "a string");
    return n.Scalar();
  }

  template <class E>
  E choose(const YAML::Node& n, const std::string& path,
           std::initializer_list<std::pair<const char*, E>> names) const {
    std::string list;
    for (const auto& [name, value] : names) list += list.empty() ? name : std::string(" | ") + name;
    if (!n.IsScalar()) fail(n, path, n, "one of " + list);
    for (const auto& [name, value] : names)
      if (n.Scalar() == name) return value;
    fail(n, path, n, "one of " + list);
  }

  Init init(const YAML::Node& n, const std::string& path) const {
    return choose<Init>(n, path,
                        {{"kaiming_uniform", Init::kaiming_uniform},
                         {"kaiming_normal", Init::kaiming_normal},
                         {"xavier_uniform", Init::xavier_uniform},
                         {"xavier_normal", Init::xavier_normal}});
  }

  // Runs a library constructor; its InvalidArgument becomes one naming the file, key and line.
  template <class F>
  auto checked(const YAML::Node& at, const std::string& path, F&& make) const {
    try {
      return make();
    } catch (const InvalidArgument& e) {
      std::string what = e.what();
      const std::size_t p = what.find(": ", what.find("rank "));
      if (what.rfind("dtrain: rank ", 0) == 0 && p != std::string::npos) what = what.substr(p + 2);
      fail(at, path, what);
    }
  }

  // --- model ----------------------------------------------------------------------------------

  void read_model(const YAML::Node& node, const std::string& path, RunConfig& run) {
    Map m(*this, node, path, {"dtype", "layers"});
    if (auto n = m.get("dtype"))
      run.dtype = choose<DType>(n, m.path("dtype"), {{"f32", DType::f32}, {"f64", DType::f64}});
    const YAML::Node layers = m.require("layers");
    run.layers = read_layers(layers, m.path("layers"), true);
  }

  std::vector<LayerSpec> read_layers(const YAML::Node& node, const std::string& path, bool top) {
    if (!node.IsSequence() || node.size() == 0)
      fail(node, path, node, "a non-empty list of layers");
    std::vector<LayerSpec> out;
    out.reserve(node.size());
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string p = path + "[" + std::to_string(i) + "]";
      out.push_back(read_layer(node[i], p, top && i == 0));
    }
    return out;
  }

  LayerSpec read_layer(const YAML::Node& node, const std::string& path, bool may_be_input) {
    if (++layer_count_ > max_layers)
      fail(node, path, "more than " + std::to_string(max_layers) + " layers");
    static const char* const kinds =
        "input | linear | relu | gelu | tanh | layer_norm | dropout | conv1d | conv2d | conv3d | "
        "max_pool1d | max_pool2d | max_pool3d | avg_pool1d | avg_pool2d | avg_pool3d | "
        "upsample1d | upsample2d | upsample3d | residual";
    std::string kind;
    YAML::Node opts;
    if (node.IsScalar()) {
      kind = node.Scalar();
    } else if (node.IsMap() && node.size() == 1) {
      const auto kv = *node.begin();
      if (!kv.first.IsScalar())
        fail(kv.first, path, kv.first, "a layer kind (" + std::string(kinds) + ")");
      kind = kv.first.Scalar();
      opts = kv.second;
    } else {
      fail(node, path, node,
           "a layer: a layer kind, or a mapping of one layer kind to its options (" +
               std::string(kinds) + ")");
    }
    const std::string p = path + "." + kind;
    if (kind == "relu" || kind == "gelu" || kind == "tanh") {
      Map(*this, opts, p, {}, node);
      if (kind == "relu") return Relu{};
      if (kind == "gelu") return Gelu{};
      return Tanh{};
    }
    if (kind == "input") {
      if (!may_be_input) fail(node, p, "input may only be the first entry of model.layers");
      if (!opts.IsSequence() || opts.size() == 0)
        fail(node, p, opts, "the shape of one sample, a list of positive integers");
      Shape shape;
      for (std::size_t i = 0; i < opts.size(); ++i)
        shape.push_back(integer(opts[i], p + "[" + std::to_string(i) + "]", 1));
      return checked(node, p, [&] { return Input(shape); });
    }
    if (kind == "linear") {
      Map m(*this, opts, p, {"in", "out", "init"}, node);
      const std::int64_t in = integer(m.require("in"), m.path("in"), 1);
      const std::int64_t out = integer(m.require("out"), m.path("out"), 1);
      const Init how = m.has("init") ? init(m.get("init"), m.path("init")) : Init::kaiming_uniform;
      return checked(node, p, [&] { return Linear(in, out, how); });
    }
    if (kind == "layer_norm") {
      Map m(*this, opts, p, {"features", "eps"}, node);
      const std::int64_t n = integer(m.require("features"), m.path("features"), 1);
      const double eps = m.has("eps") ? real(m.get("eps"), m.path("eps"), 0.0,
                                             std::numeric_limits<double>::max(), true)
                                      : 1e-5;
      return checked(node, p, [&] { return LayerNorm(n, eps); });
    }
    if (kind == "dropout") {
      Map m(*this, opts, p, {"p"}, node);
      const double prob = below_one(m.require("p"), m.path("p"));
      return checked(node, p, [&] { return Dropout(static_cast<float>(prob)); });
    }
    if (kind == "conv1d" || kind == "conv2d" || kind == "conv3d") {
      Map m(*this, opts, p,
            {"in", "out", "kernel", "stride", "padding", "padding_mode", "dilation", "init",
             "lowering"},
            node);
      const int dims = kind[4] - '0';
      const std::int64_t in = integer(m.require("in"), m.path("in"), 1);
      const std::int64_t out = integer(m.require("out"), m.path("out"), 1);
      const std::int64_t k = integer(m.require("kernel"), m.path("kernel"), 1);
      Conv c = checked(node, p, [&] { return Conv(dims, in, out, k); });
      if (auto n = m.get("stride")) c.with_stride(integer(n, m.path("stride"), 1));
      if (auto n = m.get("padding")) c.with_padding(integer(n, m.path("padding"), 0));
      if (auto n = m.get("padding_mode"))
        c.padding_mode =
            choose<Padding>(n, m.path("padding_mode"),
                            {{"zeros", Padding::zeros}, {"periodic", Padding::periodic}});
      if (auto n = m.get("dilation")) c.with_dilation(integer(n, m.path("dilation"), 1));
      if (auto n = m.get("init")) c.with_init(init(n, m.path("init")));
      if (auto n = m.get("lowering"))
        c.with_lowering(choose<ConvLowering>(n, m.path("lowering"),
                                             {{"automatic", ConvLowering::automatic},
                                              {"im2col", ConvLowering::im2col},
                                              {"shifted", ConvLowering::shifted},
                                              {"direct", ConvLowering::direct}}));
      return c;
    }
    if (kind.size() == 10 && (kind.rfind("max_pool", 0) == 0 || kind.rfind("avg_pool", 0) == 0) &&
        kind[9] == 'd' && kind[8] >= '1' && kind[8] <= '3') {
      Map m(*this, opts, p, {"kernel", "stride"}, node);
      const std::int64_t k = integer(m.require("kernel"), m.path("kernel"), 1);
      const std::int64_t s = m.has("stride") ? integer(m.get("stride"), m.path("stride"), 1) : 0;
      const Pool::Kind how = kind[0] == 'm' ? Pool::max : Pool::average;
      return checked(node, p, [&] { return Pool(how, kind[8] - '0', k, s); });
    }
    if (kind.size() == 10 && kind.rfind("upsample", 0) == 0 && kind[9] == 'd' && kind[8] >= '1' &&
        kind[8] <= '3') {
      Map m(*this, opts, p, {"scale"}, node);
      const std::int64_t s = integer(m.require("scale"), m.path("scale"), 1);
      return checked(node, p, [&] { return Upsample(kind[8] - '0', s); });
    }
    if (kind == "residual") {
      std::vector<LayerSpec> body = read_layers(opts, p, false);
      return checked(node, p, [&] { return Residual(std::move(body)); });
    }
    fail(node, path, "unknown layer kind '" + kind + "' (expected " + kinds + ")");
  }

  // --- optimizer ------------------------------------------------------------------------------

  void read_optimizer(const YAML::Node& node, const std::string& path, OptimizerConfig& o) {
    if (node.IsMap() && node["kind"])
      o.kind =
          choose<OptimizerKind>(node["kind"], path + ".kind",
                                {{"sgd", OptimizerKind::sgd}, {"adamw", OptimizerKind::adamw}});
    const bool sgd = o.kind == OptimizerKind::sgd;
    Map m = sgd ? Map(*this, node, path,
                      {"kind", "lr", "schedule", "clip_grad_norm", "momentum", "dampening",
                       "weight_decay", "nesterov"})
                : Map(*this, node, path,
                      {"kind", "lr", "schedule", "clip_grad_norm", "beta1", "beta2", "eps",
                       "weight_decay"});
    if (m.has("lr") && m.has("schedule"))
      fail(m.get("schedule"), m.path("schedule"),
           "give either lr (a constant rate) or schedule, not both");
    if (auto n = m.get("lr"))
      o.schedule =
          Schedule::constant(real(n, m.path("lr"), 0.0, std::numeric_limits<double>::max()));
    if (auto n = m.get("schedule")) o.schedule = read_schedule(n, m.path("schedule"));
    if (auto n = m.get("clip_grad_norm"))
      o.clip_grad_norm = nonnegative(n, m.path("clip_grad_norm"));
    if (sgd) {
      if (auto n = m.get("momentum")) o.sgd.momentum = real(n, m.path("momentum"), 0.0, 1.0);
      if (auto n = m.get("dampening")) o.sgd.dampening = real(n, m.path("dampening"), 0.0, 1.0);
      if (auto n = m.get("weight_decay"))
        o.sgd.weight_decay = nonnegative(n, m.path("weight_decay"));
      if (auto n = m.get("nesterov")) o.sgd.nesterov = boolean(n, m.path("nesterov"));
      if (o.sgd.nesterov && (o.sgd.momentum <= 0 || o.sgd.dampening != 0))
        fail(m.get("nesterov"), m.path("nesterov"),
             "nesterov needs momentum > 0 and dampening 0 (as PyTorch's SGD)");
    } else {
      if (auto n = m.get("beta1")) o.adamw.beta1 = below_one(n, m.path("beta1"));
      if (auto n = m.get("beta2")) o.adamw.beta2 = below_one(n, m.path("beta2"));
      if (auto n = m.get("eps"))
        o.adamw.eps = real(n, m.path("eps"), 0.0, std::numeric_limits<double>::max(), true);
      if (auto n = m.get("weight_decay"))
        o.adamw.weight_decay = nonnegative(n, m.path("weight_decay"));
    }
  }

  Schedule read_schedule(const YAML::Node& node, const std::string& path) const {
    if (!node.IsMap()) fail(node, path, node, "a mapping with the key kind");
    const Schedule::Kind kind = choose<Schedule::Kind>(
        Map(*this, node, path,
            {"kind", "lr", "step_size", "gamma", "peak", "warmup_steps", "total_steps", "min_lr"})
            .require("kind"),
        path + ".kind",
        {{"constant", Schedule::Kind::constant},
         {"step", Schedule::Kind::step},
         {"warmup_cosine", Schedule::Kind::warmup_cosine}});
    const double big = std::numeric_limits<double>::max();
    switch (kind) {
      case Schedule::Kind::constant: {
        Map m(*this, node, path, {"kind", "lr"});
        return Schedule::constant(real(m.require("lr"), m.path("lr"), 0.0, big));
      }
      case Schedule::Kind::step: {
        Map m(*this, node, path, {"kind", "lr", "step_size", "gamma"});
        const double lr = real(m.require("lr"), m.path("lr"), 0.0, big);
        const std::int64_t size = integer(m.require("step_size"), m.path("step_size"), 1);
        const double gamma = real(m.require("gamma"), m.path("gamma"), 0.0, big);
        return checked(node, path, [&] { return Schedule::step_decay(lr, size, gamma); });
      }
      case Schedule::Kind::warmup_cosine: {
        Map m(*this, node, path, {"kind", "peak", "warmup_steps", "total_steps", "min_lr"});
        const double peak = real(m.require("peak"), m.path("peak"), 0.0, big);
        const std::int64_t warm = integer(m.require("warmup_steps"), m.path("warmup_steps"), 0);
        const std::int64_t total = integer(m.require("total_steps"), m.path("total_steps"), 1);
        const double min_lr =
            m.has("min_lr") ? real(m.get("min_lr"), m.path("min_lr"), 0.0, big) : 0.0;
        return checked(node, path,
                       [&] { return Schedule::warmup_cosine(peak, warm, total, min_lr); });
      }
    }
    fail(node, path, "unknown schedule");
  }

  // --- sync -----------------------------------------------------------------------------------

  void read_sync(const YAML::Node& node, const std::string& path, SyncConfig& s) const {
    if (node.IsMap() && node["mode"])
      s.mode = choose<SyncMode>(node["mode"], path + ".mode",
                                {{"replicated", SyncMode::replicated},
                                 {"sharded", SyncMode::sharded},
                                 {"fully_sharded", SyncMode::fully_sharded}});
    const bool fs = s.mode == SyncMode::fully_sharded;
    // A key that the chosen mode does not read is refused rather than ignored.
    Map m =
        fs ? Map(*this, node, path, {"mode", "reproducible", "unit_bytes", "buffers", "prefetch"})
           : Map(*this, node, path, {"mode", "reproducible", "bucket_bytes", "algorithm"});
    if (auto n = m.get("reproducible")) s.reproducible = boolean(n, m.path("reproducible"));
    if (auto n = m.get("bucket_bytes"))
      s.bucket_bytes = static_cast<std::size_t>(integer(n, m.path("bucket_bytes"), 1));
    if (auto n = m.get("algorithm")) {
      const std::string name = string(n, m.path("algorithm"));
      s.algorithm =
          checked(n, m.path("algorithm"), [&] { return allreduce_algorithm_from_name(name); });
    }
    if (auto n = m.get("unit_bytes"))
      s.fully_sharded.unit_bytes = static_cast<std::size_t>(integer(n, m.path("unit_bytes"), 0));
    if (auto n = m.get("buffers"))
      s.fully_sharded.buffers = static_cast<int>(integer(n, m.path("buffers"), 1, 3));
    if (auto n = m.get("prefetch")) s.fully_sharded.prefetch = boolean(n, m.path("prefetch"));
  }

  // --- checkpoint -----------------------------------------------------------------------------

  void read_checkpoint(const YAML::Node& node, const std::string& path, CheckpointConfig& c) const {
    Map m(*this, node, path,
          {"directory", "every_steps", "every_seconds", "keep_last", "async", "prefix", "strategy",
           "restore", "levels"});
    CheckpointOptions& o = c.options;
    if (auto n = m.get("directory")) c.directory = string(n, m.path("directory"));
    if (auto n = m.get("every_steps")) o.every_steps = integer(n, m.path("every_steps"), 0);
    if (auto n = m.get("every_seconds")) o.every_seconds = nonnegative(n, m.path("every_seconds"));
    if (auto n = m.get("keep_last"))
      o.keep_last = static_cast<int>(integer(n, m.path("keep_last"), 1, 1 << 30));
    if (auto n = m.get("async")) o.async = boolean(n, m.path("async"));
    if (auto n = m.get("prefix")) {
      o.prefix = string(n, m.path("prefix"));
      if (o.prefix.empty() || o.prefix.find('/') != std::string::npos)
        fail(n, m.path("prefix"), n, "a non-empty file name prefix without '/'");
    }
    if (auto n = m.get("strategy"))
      o.strategy =
          choose<CheckpointStrategy>(n, m.path("strategy"),
                                     {{"automatic", CheckpointStrategy::automatic},
                                      {"rank0", CheckpointStrategy::rank0},
                                      {"parallel_rank0", CheckpointStrategy::parallel_rank0},
                                      {"parallel_slices", CheckpointStrategy::parallel_slices}});
    if (auto n = m.get("restore"))
      o.restore = choose<RestoreStrategy>(n, m.path("restore"),
                                          {{"automatic", RestoreStrategy::automatic},
                                           {"rank0", RestoreStrategy::rank0},
                                           {"distributed", RestoreStrategy::distributed}});
    if (auto n = m.get("levels")) {
      Map l(*this, n, m.path("levels"),
            {"local_dir", "local_every", "partner", "shared_every", "transfer_timeout_seconds"});
      CheckpointLevelOptions& v = o.levels;
      if (auto x = l.get("local_dir")) v.local_dir = string(x, l.path("local_dir"));
      if (auto x = l.get("local_every"))
        v.local_every = integer(x, l.path("local_every"), 0, std::int64_t{1} << 62);
      if (auto x = l.get("partner")) v.partner = boolean(x, l.path("partner"));
      if (auto x = l.get("shared_every"))
        v.shared_every = static_cast<int>(integer(x, l.path("shared_every"), 0, 1 << 30));
      if (auto x = l.get("transfer_timeout_seconds"))
        v.transfer_timeout_seconds = real(x, l.path("transfer_timeout_seconds"), 0.0,
                                          std::numeric_limits<double>::max(), true);
      if (!v.enabled() && l.node().IsMap() && l.node().size() > 0)
        fail(n, m.path("levels"),
             "levels need local_dir (the node-local directory); without it the other keys have no "
             "effect");
    }
  }

  std::string op_;
  std::string source_;
  std::size_t layer_count_ = 0;
};

}  // namespace detail

inline RunConfig parse_run_config(const std::string& text, const std::string& source) {
  return detail::RunConfigReader("parse_run_config", source).read(text);
}

inline RunConfig read_run_config(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    raise<IoError>("read_run_config", "the run description " + path + " is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    raise<IoError>("read_run_config",
                   "cannot open the run description " + path + ": " + detail::errno_text(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    raise<IoError>("read_run_config",
                   "cannot read the run description " + path + ": " + detail::errno_text(errno));
  return detail::RunConfigReader("read_run_config", path).read(text.str());
}

}  // namespace dtrain
