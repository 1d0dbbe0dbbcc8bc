# engine runtime: KV cache, forward pass, scheduler, the CPU Engine.
add_library(bitroll_engine STATIC
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cc
  ${CMAKE_CURRENT_LIST_DIR}/scheduler.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_engine.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_loader.cc)
target_include_directories(bitroll_engine PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(bitroll_engine PUBLIC bitroll_model bitroll_kernels bitroll_status Threads::Threads)
