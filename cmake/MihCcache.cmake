# Compiles through ccache when it is installed (MIH_USE_CCACHE, default ON).
# The sloppiness settings let ccache cache translation units that use the shared precompiled
# header (ccache refuses PCH users otherwise and silently compiles them uncached). BASEDIR and
# NOHASHDIR let two checkouts of the tree (a clean clone, a worktree) share cached objects;
# so does leaving the -fmacro-prefix-map options (MihHelpers.cmake) out of the hash: they name
# the checkout's own path, and map every checkout's __FILE__ to the same relative path.
if(MIH_USE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(MIH_CCACHE_PROGRAM ccache)
  if(MIH_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER
        "${CMAKE_COMMAND}" -E env
        "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
        "CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}" "CCACHE_NOHASHDIR=1" "CCACHE_IGNOREOPTIONS=-fmacro-prefix-map=*"
        "${MIH_CCACHE_PROGRAM}")
    message(STATUS "mih: compiling through ccache (${MIH_CCACHE_PROGRAM})")
  else()
    message(STATUS "mih: ccache not found; builds are not cached (apt-get install ccache)")
  endif()
endif()
