# Whether MIH_TRANSFORMERS_PYTHON runs Hugging Face transformers: sets MIH_TRANSFORMERS_OK and
# MIH_TRANSFORMERS_VERSION (checked once per path; a path that cannot import it is a warning,
# and the goldens come from the builtin original).
if(MIH_TRANSFORMERS_PYTHON AND NOT MIH_TRANSFORMERS_CHECKED STREQUAL MIH_TRANSFORMERS_PYTHON)
  execute_process(COMMAND "${MIH_TRANSFORMERS_PYTHON}" -c "import torch, transformers; print(transformers.__version__)"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE version ERROR_VARIABLE error OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0)
    set(MIH_TRANSFORMERS_VERSION "${version}" CACHE INTERNAL "")
  else()
    set(MIH_TRANSFORMERS_VERSION "" CACHE INTERNAL "")
    message(WARNING "MIH_TRANSFORMERS_PYTHON=${MIH_TRANSFORMERS_PYTHON} cannot import torch and transformers "
                    "(${error}): the reference specs' goldens come from the builtin original")
  endif()
  set(MIH_TRANSFORMERS_CHECKED "${MIH_TRANSFORMERS_PYTHON}" CACHE INTERNAL "")
elseif(NOT MIH_TRANSFORMERS_PYTHON)
  set(MIH_TRANSFORMERS_VERSION "" CACHE INTERNAL "")
  set(MIH_TRANSFORMERS_CHECKED "" CACHE INTERNAL "")
endif()
if(MIH_TRANSFORMERS_VERSION)
  set(MIH_TRANSFORMERS_OK TRUE)
  message(STATUS "Goldens of the reference specs: transformers ${MIH_TRANSFORMERS_VERSION} (${MIH_TRANSFORMERS_PYTHON})")
else()
  set(MIH_TRANSFORMERS_OK FALSE)
  message(STATUS "Goldens of the reference specs: the builtin original (no MIH_TRANSFORMERS_PYTHON with transformers)")
endif()
