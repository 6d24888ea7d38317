# Spack recipe for dtrain, kept in dtrain's own source tree (packaging/spack). The variants map
# one to one onto the DTRAIN_ENABLE_<COMPONENT> options of CMakeLists.txt;
# tests/packaging/check_spack_recipe.py keeps the two in step.

import os

from spack.package import *


class Dtrain(CMakePackage, CudaPackage, ROCmPackage):
    """Header-only C++17 library for data-parallel training of neural networks inside MPI
    codes: sharded data loading, gradient all-reduce over MPI or RDMA verbs, CPU (BLAS) and
    CUDA/HIP kernels, and parallel HDF5 checkpoints.

    No release archive is published yet: build from a checkout with `spack develop` inside an
    environment (see packaging/spack/README.md)."""

    license("BSD-3-Clause")

    # Keep equal to project(dtrain VERSION ...) in CMakeLists.txt.
    version("0.1.0")

    # Each component variant gives its CMake option ON or OFF, never AUTO: a component Spack
    # was asked for must be found (configure fails otherwise), and one it was not asked for is
    # not picked up from the host system by accident.
    variant("mpi", default=True, description="MPI transport (dtrain::mpi)")
    variant(
        "hdf5", default=True, description="Parallel HDF5 datasets and checkpoints (dtrain::hdf5)"
    )
    variant("ibverbs", default=False, description="RDMA verbs transport (dtrain::ibverbs)")
    variant("blas", default=True, description="CBLAS fast path of the host kernels (dtrain::blas)")
    variant("config", default=True, description="Run description files, YAML (dtrain::config)")
    # +cuda / cuda_arch come from CudaPackage, +rocm / amdgpu_target from ROCmPackage.

    depends_on("c", type="build")  # FindMPI's and FindHDF5's probes compile C
    depends_on("cxx", type="build")
    depends_on("cmake@3.21:", type="build")

    # The headers need these at the consumer's build time: dtrain's installed package
    # configuration looks for them again there, so they are link dependencies.
    depends_on("mpi", when="+mpi")
    depends_on("hdf5+mpi", when="+hdf5+mpi")
    depends_on("rdma-core", when="+ibverbs")
    depends_on("blas", when="+blas")
    depends_on("yaml-cpp", when="+config")

    depends_on("doctest", type="test")

    conflicts("+hdf5", when="~mpi", msg="dtrain uses parallel HDF5, which needs +mpi")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("DTRAIN_ENABLE_MPI", "mpi"),
            self.define_from_variant("DTRAIN_ENABLE_HDF5", "hdf5"),
            self.define_from_variant("DTRAIN_ENABLE_IBVERBS", "ibverbs"),
            self.define_from_variant("DTRAIN_ENABLE_BLAS", "blas"),
            self.define_from_variant("DTRAIN_ENABLE_CONFIG", "config"),
            self.define_from_variant("DTRAIN_ENABLE_CUDA", "cuda"),
            self.define_from_variant("DTRAIN_ENABLE_HIP", "rocm"),
            # The library is headers only: nothing is compiled unless the tests are wanted.
            # Examples are self-checking tests too; benchmarks never are.
            self.define("DTRAIN_BUILD_TESTS", self.run_tests),
            self.define("DTRAIN_BUILD_EXAMPLES", self.run_tests),
            self.define("DTRAIN_BUILD_BENCHMARKS", False),
        ]

        # Point the component discovery at Spack's dependencies. Without these, CMake looks for
        # the Debian wrapper names (mpicxx.mpich, h5pcc.mpich) first, and any other BLAS library
        # first by name, so a system MPI, HDF5 or OpenBLAS could be taken over Spack's.
        if spec.satisfies("+mpi"):
            args.append(self.define("MPI_C_COMPILER", spec["mpi"].mpicc))
            args.append(self.define("MPI_CXX_COMPILER", spec["mpi"].mpicxx))
        if spec.satisfies("+hdf5"):
            h5pcc = os.path.join(spec["hdf5"].prefix.bin, "h5pcc")
            if os.path.exists(h5pcc):
                args.append(self.define("HDF5_C_COMPILER_EXECUTABLE", h5pcc))
        if spec.satisfies("+blas"):
            args.append(self.define("DTRAIN_CBLAS_LIBRARY", spec["blas"].libs.joined(";")))
        if spec.satisfies("+cuda"):
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))

        # The GPU architectures and hipcc are read only where dtrain compiles device code of
        # its own, i.e. its tests and examples. An installed dtrain keeps no architecture: a
        # consuming project chooses its own DTRAIN_CUDA_ARCHS / DTRAIN_HIP_ARCHS.
        if self.run_tests:
            if spec.satisfies("+mpi"):
                mpiexec = os.path.join(spec["mpi"].prefix.bin, "mpiexec")
                if os.path.exists(mpiexec):
                    args.append(self.define("MPIEXEC_EXECUTABLE", mpiexec))
            if spec.satisfies("+cuda"):
                cuda_archs = [a for a in spec.variants["cuda_arch"].value if a != "none"]
                if cuda_archs:
                    args.append(self.define("DTRAIN_CUDA_ARCHS", cuda_archs))
            if spec.satisfies("+rocm"):
                hipcc = os.path.join(spec["hip"].prefix.bin, "hipcc")
                args.append(self.define("DTRAIN_HIPCC", hipcc))
                hip_archs = [a for a in spec.variants["amdgpu_target"].value if a != "none"]
                if hip_archs:
                    args.append(self.define("DTRAIN_HIP_ARCHS", hip_archs))
        return args
