// SPDX-License-Identifier: BSD-3-Clause
// dtrain: the objects a checkpoint is made of: checking their top-level names and collecting
// their state into manifest entries.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <dtrain/ckpt/detail/manifest.hpp>
#include <dtrain/ckpt/serializer.hpp>
#include <dtrain/core/error.hpp>

namespace dtrain::detail {

/// Local. Throws InvalidArgument for a reserved, repeated or null top-level object.
template <class T>
void check_top_name(const Named<T>& n, std::set<std::string>& names) {
  check_state_name(n.name, "checkpoint");
  DTRAIN_REQUIRE(n.name.find('/') == std::string::npos && n.name != "ranks" && n.name != "config" &&
                     n.name != "held_parts",
                 "checkpoint",
                 "object name '" << n.name
                                 << "' is reserved or has a '/' (names: one component, not "
                                    "'ranks', 'config' or 'held_parts')");
  DTRAIN_REQUIRE(names.insert(n.name).second, "checkpoint",
                 "object name '" << n.name << "' passed twice");
  DTRAIN_REQUIRE(n.object != nullptr, "checkpoint", "object '" << n.name << "' is null");
  static_assert(is_serializable_v<T>,
                "dtrain checkpoint: the object type has no visit_state and no "
                "dtrain::serializer specialisation");
}

/// Local. Collects the objects' state: replicated objects into `repl` (paths "/name/..."),
/// per-rank objects into `mine` (paths "/ranks/<rank>/name/...").
template <class... Ts>
void collect_objects(int rank, std::vector<CkptEntry>& repl, std::vector<CkptEntry>& mine,
                     const Named<Ts>&... objects) {
  std::set<std::string> names;
  (check_top_name(objects, names), ...);
  auto one = [&](const auto& n) {
    if (n.placement == Placement::replicated) {
      SaveCollector v(repl, "/" + n.name, -1);
      visit_object(v, *n.object);
    } else {
      SaveCollector v(mine, "/ranks/" + std::to_string(rank) + "/" + n.name, rank);
      visit_object(v, *n.object);
    }
  };
  (one(objects), ...);
  std::set<std::string> paths;
  for (const auto* list : {&repl, &mine})
    for (const auto& e : *list)
      DTRAIN_REQUIRE(paths.insert(e.path).second, "checkpoint save",
                     "state name " << e.path << " visited twice");
}

}  // namespace dtrain::detail
