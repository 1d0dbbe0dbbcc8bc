// python/ext/rope_ext.h: registers rope_tables / rope_tabled (rope_ext.cc) on the kernels module.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "kernels/cpu/isa.h"

namespace bitroll_ext {

// Adds the functions to `m`; they read the module's ISA through `isa` (which must outlive it).
void AddRope(pybind11::module_& m, const bitroll::kernels::Isa* isa);

}  // namespace bitroll_ext
