// Example 20's simulation: the scientist's existing MPI code, which knows nothing of training. An
// explicit five-point solver of u_t = D (u_xx + u_yy) on a periodic nx x ny grid whose rows are
// split over the ranks of MPI_COMM_WORLD, each rank holding its rows plus `halo` ghost rows either
// side (kept current by its own halo exchange). Also here: its exact check (a Fourier mode decays
// by a known factor per step), its initial field, its checkpointed state and a fingerprint of the
// whole field.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <dtrain/core/rng.hpp>
#include <dtrain/core/span.hpp>
#include <dtrain/core/tensor.hpp>

inline double sum_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return x;
}

inline std::uint64_t fnv1a(const void* data, std::size_t bytes,
                           std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < bytes; ++i)
    h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return h;
}

// Rows [row0, row0 + rows) of the periodic grid, with `halo` ghost rows on each side.
struct Grid {
  int nx = 0, ny = 0, rows = 0, row0 = 0, halo = 0, rank = 0, size = 1;
  std::size_t cells() const { return std::size_t(rows + 2 * halo) * nx; }
  std::size_t at(int i, int j) const { return std::size_t(i + halo) * nx + j; }
  void exchange(std::vector<double>& u) const {
    const int n = halo * nx, up = (rank + size - 1) % size, down = (rank + 1) % size;
    auto one = [&](std::size_t send, int to, int tag, std::size_t recv, int from) {
      MPI_Status st;
      int count = 0;
      MPI_Sendrecv(&u[send], n, MPI_DOUBLE, to, tag, &u[recv], n, MPI_DOUBLE, from, MPI_ANY_TAG,
                   MPI_COMM_WORLD, &st);
      MPI_Get_count(&st, MPI_DOUBLE, &count);
      if (st.MPI_TAG != tag || count != n)  // a message of dtrain's would have another tag
        throw std::runtime_error("insitu: rank " + std::to_string(rank) +
                                 ": foreign message in the halo exchange");
    };
    one(at(0, 0), up, 1, at(rows, 0), down);
    one(at(rows - halo, 0), down, 2, at(-halo, 0), up);
  }
  // One explicit step (r = D dt / dx^2), then the halo exchange: ghost rows stay current.
  void step(std::vector<double>& u, std::vector<double>& tmp, double r) const {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < nx; ++j) {
        const double c = u[at(i, j)], w = u[at(i, j ? j - 1 : nx - 1)];
        const double e = u[at(i, j + 1 < nx ? j + 1 : 0)];
        tmp[at(i, j)] = c + r * (u[at(i - 1, j)] + u[at(i + 1, j)] + w + e - 4 * c);
      }
    std::copy(tmp.begin() + at(0, 0), tmp.begin() + at(rows, 0), u.begin() + at(0, 0));
    exchange(u);
  }
  double total(const std::vector<double>& u) const {
    double s = 0;
    for (std::size_t k = at(0, 0); k < at(rows, 0); ++k) s += u[k];
    return sum_ranks(s);
  }
  // The squared distance of two fields over all cells (ghost rows aside).
  double distance2(const std::vector<double>& a, const std::vector<double>& b) const {
    double s = 0;
    for (std::size_t k = at(0, 0); k < at(rows, 0); ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
    return sum_ranks(s);
  }
  // Collective: FNV-1a of the whole field's own rows, gathered in rank order (valid on rank 0).
  std::uint64_t fingerprint(const std::vector<double>& u) const {
    std::uint64_t fh = fnv1a(&u[at(0, 0)], std::size_t(rows) * nx * sizeof(double));
    std::vector<std::uint64_t> all(size);
    MPI_Gather(&fh, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    std::uint64_t h = 1469598103934665603ull;
    for (auto x : all) h = fnv1a(&x, sizeof x, h);
    return h;
  }
};

// This rank's share of an nx x ny grid on MPI_COMM_WORLD (rows split as evenly as they go).
inline Grid make_grid(long long nx, long long ny, int halo) {
  Grid g;
  MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g.size);
  g.nx = int(nx), g.ny = int(ny), g.halo = halo, g.row0 = int(ny * g.rank / g.size);
  g.rows = int(ny * (g.rank + 1) / g.size) - g.row0;
  return g;
}

// Solver check: a product of cosines decays by exactly 1 + r (2 cos a + 2 cos b - 4) per step.
inline double fourier_decay_error(const Grid& g, double r, int steps) {
  const double pi = 3.14159265358979323846, a = 2 * pi * 3 / g.nx, b = 2 * pi * 2 / g.ny;
  std::vector<double> u(g.cells()), tmp(g.cells());
  auto mode = [&](int i, int j) { return std::cos(a * j) * std::cos(b * (g.row0 + i)); };
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j) u[g.at(i, j)] = 1 + 0.5 * mode(i, j);
  g.exchange(u);
  for (int s = 0; s < steps; ++s) g.step(u, tmp, r);
  const double amp = 0.5 * std::pow(1 + r * (2 * std::cos(a) + 2 * std::cos(b) - 4), steps);
  double err = 0;
  for (int i = 0; i < g.rows; ++i)
    for (int j = 0; j < g.nx; ++j)
      err = std::max(err, std::abs(u[g.at(i, j)] - 1 - amp * mode(i, j)));
  MPI_Allreduce(MPI_IN_PLACE, &err, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return err;
}

// Warm and cold Gaussian blobs (2 to 6 cells wide, one per 16 x 16 cells) placed by the seed.
inline void initial_field(const Grid& g, std::uint64_t seed, std::vector<double>& u) {
  dtrain::RngStream rng(seed, 0x1b10b5);
  std::fill(u.begin(), u.end(), 1.0);
  auto dist = [](double p, double q, int n) {
    return std::min(std::abs(p - q), n - std::abs(p - q));
  };
  for (int k = 0; k < std::max(8, g.nx * g.ny / 256); ++k) {
    const double x = rng.uniform_double() * g.nx, y = rng.uniform_double() * g.ny;
    const double amp = 2 * rng.uniform_double() - 1, s = 2 + 4 * rng.uniform_double();
    for (int i = 0; i < g.rows; ++i)
      for (int j = 0; j < g.nx; ++j) {
        const double dx = dist(j, x, g.nx), dy = dist(g.row0 + i, y, g.ny);
        if (dy < 5 * s) u[g.at(i, j)] += amp * std::exp(-(dx * dx + dy * dy) / (2 * s * s));
      }
  }
  g.exchange(u);
}

// The simulation's checkpointed state on one rank, with the in-situ training's counters.
struct SimState {
  long long step = 0, trained = 0, tiles = 0;  // trained: optimizer steps; tiles: samples stored
  double initial_total = 0, first_error = -1;
  std::vector<double> u, snap;  // the field and the snapshot waiting for its target (with halos)
  dtrain::Shape shape;
  template <class V>
  void visit_state(V& v) {
    v.scalar("step", step);
    v.scalar("trained", trained);
    v.scalar("tiles", tiles);  // read first on restore: the store grows to this size
    v.scalar("initial_total", initial_total);
    v.scalar("first_error", first_error);
    v.tensor("u", dtrain::BufferView(u.data(), u.size(), dtrain::DType::f64), shape);
    v.tensor("snap", dtrain::BufferView(snap.data(), snap.size(), dtrain::DType::f64), shape);
  }
};

// The simulation's start: the initial field, its total heat, and the first snapshot.
inline SimState initial_state(const Grid& g, std::uint64_t seed) {
  SimState sim;
  sim.shape = dtrain::Shape{g.rows + 2 * g.halo, g.nx};
  sim.u = std::vector<double>(g.cells());
  initial_field(g, seed, sim.u);
  sim.initial_total = g.total(sim.u);
  sim.snap = sim.u;
  return sim;
}
