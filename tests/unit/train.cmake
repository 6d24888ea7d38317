# train/: progress line, step-keyed CSV logs, straggler telemetry, JSON summary, run-directory lock.
dtrain_add_unit_test(NAME unit_train IN test_core
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/train_test.cpp
  LINK dtrain::loopback
  TIMEOUT 60)
# scripts/plot-metrics on a committed metrics.csv of a real example 10 run; the PNG it draws is
# checked with python3's standard library (signature, IHDR, chunk CRCs, IDAT inflating to the rows
# IHDR promises). Skipped (77) without gnuplot.
find_program(DTRAIN_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(DTRAIN_SYSTEM_PYTHON3)
  add_test(NAME train_plot_metrics
    COMMAND ${DTRAIN_SYSTEM_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/train_plot_metrics.py
            ${PROJECT_SOURCE_DIR}/scripts/plot-metrics
            ${CMAKE_CURRENT_LIST_DIR}/train_plot_metrics.csv
            ${CMAKE_CURRENT_BINARY_DIR}/train_plot_metrics)
  set_tests_properties(train_plot_metrics PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)
endif()
