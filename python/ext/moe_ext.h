// python/ext/moe_ext.h: registers moe_route / moe_combine (moe_ext.cc) on the kernels module.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "kernels/cpu/isa.h"

namespace bitroll_ext {

// Adds the functions to `m`; they read the module's ISA through `isa` (which must outlive it).
void AddMoe(pybind11::module_& m, const bitroll::kernels::Isa* isa);

}  // namespace bitroll_ext
