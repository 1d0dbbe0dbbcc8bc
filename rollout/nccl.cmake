# rollout/nccl.cmake: NCCL weight updates on the trainer's side (included by
# rollout/CMakeLists.txt). The sender is compiled in every build: with BITROLL_HAVE_NCCL (which
# kernels/cuda.cmake puts on bitroll_kernels_cuda, reaching bitroll_rollout through
# bitroll_engine) it broadcasts, without it BroadcastWeightsNccl returns kUnsupported.
target_sources(bitroll_rollout PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nccl_weight_sender.cc)

# examples/cpp/nccl_update_weights.cc: a trainer that loads a model file (engine loader) and
# broadcasts it. Built wherever the engine is; without a GPU it fails with a clear message.
if(TARGET bitroll_engine)
  add_executable(nccl_update_weights ${CMAKE_SOURCE_DIR}/examples/cpp/nccl_update_weights.cc)
  target_link_libraries(nccl_update_weights PRIVATE bitroll_rollout bitroll_engine)
  if(BITROLL_HAVE_CUDA)
    target_link_libraries(nccl_update_weights PRIVATE CUDA::cudart)
  endif()
endif()
