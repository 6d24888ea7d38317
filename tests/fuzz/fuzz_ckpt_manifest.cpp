// Fuzz target: the checkpoint manifest as the restore path receives it (the header and entries
// that rank 0 sends the other ranks), decoded and then restored into a fixed set of objects on a
// one-rank communicator. Arbitrary bytes must end in a dtrain::Error or in a restore whose
// objects hold exactly what the manifest said.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <dtrain/ckpt/checkpointer.hpp>
#include <dtrain/core/error.hpp>

#include "fuzz_support.hpp"

namespace {

struct Layer {
  std::vector<float> w = std::vector<float>(6, 0.0f);
  std::vector<std::int64_t> ids = std::vector<std::int64_t>(2, 0);
  template <class V>
  void visit_state(V& v) {
    v.tensor("w", dtrain::BufferView(w.data(), w.size(), dtrain::DType::f32), dtrain::Shape{2, 3});
    v.tensor("ids", dtrain::BufferView(ids.data(), ids.size(), dtrain::DType::i64),
             dtrain::Shape{2});
  }
};

struct Model {
  Layer fc;
  std::int64_t step = 0;
  double lr = 0;
  std::string name;
  template <class V>
  void visit_state(V& v) {
    v.child("fc", fc);
    v.scalar("step", step);
    v.scalar("lr", lr);
    v.scalar("name", name);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  dtrain::fuzz::SelfComm comm;
  dtrain::detail::CkptManifest m;
  try {
    dtrain::detail::BlobReader r(data, size);
    dtrain::detail::decode_header(r, m);
    const auto n = r.get_i64();
    for (std::int64_t i = 0; i < n; ++i) m.entries.push_back(dtrain::detail::decode_entry(r));
  } catch (const dtrain::Error&) {
    return 0;
  }
  // Rank 0 restores from the file it read, which holds every tensor's bytes.
  for (const auto& e : m.entries)
    if (e.kind == dtrain::detail::EntryKind::tensor && e.bytes() > 0 && !e.data) return 0;
  Model model, per;
  try {
    dtrain::detail::restore_objects(comm, dtrain::CheckpointOptions{}, m, "fuzz",
                                    dtrain::named("model", model), dtrain::per_rank("mine", per));
  } catch (const dtrain::Error&) {
    return 0;
  }
  // Restored: every tensor of the model must equal the manifest's bytes.
  for (const auto& e : m.entries)
    if (e.path == "/model/fc/w" && e.data &&
        std::memcmp(e.data, model.fc.w.data(), model.fc.w.size() * sizeof(float)) != 0)
      __builtin_trap();
  return 0;
}
