# Compiles through ccache when it is installed (MIH_USE_CCACHE, default ON).
# The sloppiness settings let ccache cache translation units that use the shared precompiled
# header (ccache refuses PCH users otherwise and silently compiles them uncached).
if(MIH_USE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(MIH_CCACHE_PROGRAM ccache)
  if(MIH_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER
        "${CMAKE_COMMAND}" -E env
        "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
        "${MIH_CCACHE_PROGRAM}")
    message(STATUS "mih: compiling through ccache (${MIH_CCACHE_PROGRAM})")
  else()
    message(STATUS "mih: ccache not found; builds are not cached (apt-get install ccache)")
  endif()
endif()
