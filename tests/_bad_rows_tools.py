"""The bad-input table's rows for the tools around the ops (tests/test_bad_inputs.py runs
them; docs/errors.md documents them): tuned-config files, the CLIs, several processes, an
unsupported GPU or a missing extension, the launch-time switches and the plan overrides. The
cases themselves are in _bad_cases_tools.py."""
from __future__ import annotations

import pytest

from jax_flashoverlap import _ext
from _bad_cases_common import *  # noqa: F401,F403  (expectations, helpers, imports)
from _bad_cases_api import *  # noqa: F401,F403
from _bad_cases_tools import *  # noqa: F401,F403
from _bad_cases_scripts import *  # noqa: F401,F403

CFG = tuning.ConfigError

TOOL_ROWS = [
    # --- tuned-config files ---
    pytest.param(cfg_not_json, raises(CFG, "plans.json", "not JSON"), id="config-not-json"),
    pytest.param(cfg_top_level_not_object, raises(CFG, "plans.json", "top level must be a JSON "
                                                  "object"), id="config-not-an-object"),
    pytest.param(cfg_wrong_schema, raises(CFG, "plans.json", "'schema' must be "
                                          "'jax_flashoverlap.plans/1'",
                                          "got 'jax_flashoverlap.plans/2'"),
                 id="config-wrong-schema-version"),
    pytest.param(cfg_missing_gpu, raises(CFG, "plans.json", "'gpu' must be the GPU's device_kind"),
                 id="config-missing-gpu"),
    pytest.param(cfg_missing_entries, raises(CFG, "plans.json", "'entries' must be a list"),
                 id="config-missing-entries"),
    pytest.param(cfg_entry_missing_field, raises(CFG, "plans.json", "entries[0]: 'm' must be an "
                                                 "integer, got None"),
                 id="config-entry-missing-field"),
    pytest.param(cfg_world_size_wrong_type, raises(CFG, "plans.json", "'world_size' must be an "
                                                   "integer, got '2'"),
                 id="config-world-size-wrong-type"),
    pytest.param(cfg_band_rows_wrong_type, raises(CFG, "plans.json", "entries[0]: 'band_rows' "
                                                  "must be a list of at least 2 integers"),
                 id="config-band-rows-wrong-type"),
    pytest.param(cfg_bands_do_not_sum_to_m, raises(CFG, "plans.json", "band_rows (0, 512, 1000) "
                                                   "must start at 0 and end at 1024"),
                 id="config-bands-do-not-sum-to-m"),
    pytest.param(cfg_rs_bands_wrong_size, raises(CFG, "plans.json", "must start at 0 and end at "
                                                 "512"),
                 id="config-reduce-scatter-bands-wrong-size"),
    pytest.param(cfg_measured_ms_not_number, raises(CFG, "plans.json", "'measured_ms' must be a "
                                                    "finite non-negative number of "
                                                    "milliseconds, got 'fast'"),
                 id="config-measured-ms-wrong-type"),
    pytest.param(cfg_measured_ms_huge, raises(CFG, "plans.json", "entries[0]: 'measured_ms' must "
                                              "be a finite non-negative number", "(401 "
                                              "characters)"),
                 id="config-measured-ms-too-large"),
    pytest.param(cfg_unknown_key, raises(CFG, "plans.json", "entries[0]: unknown key 'overlapp' "
                                         "(did you mean 'overlap'?)"),
                 id="config-entry-unknown-key"),
    pytest.param(cfg_unknown_key_cta_policy, raises(CFG, "plans.json", "entries[0]: unknown key "
                                                    "'cta_polcy' (did you mean 'cta_policy'?)"),
                 id="config-entry-unknown-key-cta-policy"),
    pytest.param(cfg_other_collectives_key, raises(CFG, "plans.json", "entries[0]: key 'chunks' "
                                                   "is not a key of all_reduce entries"),
                 id="config-entry-other-collectives-key"),
    pytest.param(cfg_not_utf8, raises(CFG, "plans.json", "not UTF-8 text"),
                 id="config-not-utf8"),
    pytest.param(cfg_duplicate_key, raises(CFG, "plans.json", "duplicate key 'overlap'"),
                 id="config-duplicate-key"),
    pytest.param(cfg_missing_file, raises(CFG, "missing.json", "cannot read tuned-config file"),
                 id="config-file-missing"),
    pytest.param(cfg_broken_symlink, raises(CFG, "cannot read tuned-config file",
                                            "plans.json", "No such file"),
                 id="config-broken-symlink"),
    pytest.param(cfg_nested_too_deep, raises(CFG, "invalid tuned-config file", "plans.json",
                                             "not JSON that can be read (RecursionError"),
                 id="config-nested-too-deep"),
    pytest.param(cfg_integer_too_long, raises(CFG, "invalid tuned-config file", "plans.json",
                                              "not JSON that can be read (ValueError",
                                              "4300 digits"),
                 id="config-integer-of-5000-digits"),
    pytest.param(cfg_fifo, raises(CFG, "cannot read tuned-config file", "plans.json",
                                  "not a regular file"),
                 id="config-a-fifo"),
    pytest.param(cfg_bad_file_at_lowering, raises(CFG, "plans.json", "comm_sms", "500"),
                 id="config-bad-file-fails-the-plan-choice"),
    pytest.param(cfg_merge_into_non_json, raises(CFG, "plans.json", "not JSON"),
                 id="config-merge-into-non-json"),
    pytest.param(env_config_dir_missing, raises(CFG, tuning.CONFIG_DIR_ENV, "tunde'",
                                                "must be a directory", "does not exist"),
                 id="env-config-dir-missing"),
    pytest.param(env_config_dir_a_file, raises(CFG, tuning.CONFIG_DIR_ENV, "plans.json",
                                               "must be a directory", "is not a directory"),
                 id="env-config-dir-a-file"),
    pytest.param(env_tuned_typo, raises(ValueError, tuning.TUNED_ENV, "'fasle'",
                                        "is not an on/off switch"),
                 id="env-tuned-typo"),
    # --- CLIs (subprocesses, JAX_PLATFORMS=cpu) ---
    pytest.param(cli_bench_shapes_malformed, exits(2, "argument --shapes", "shape must be MxNxK",
                                                   "got '12x34'"),
                 id="cli-bench-shapes-malformed"),
    pytest.param(cli_bench_shapes_not_integers, exits(2, "argument --shapes", "MxNxK", "'axbxc'"),
                 id="cli-bench-shapes-not-integers"),
    pytest.param(cli_bench_shapes_zero, exits(2, "argument --shapes", "positive", "'0x8x8'"),
                 id="cli-bench-shapes-zero"),
    pytest.param(cli_bench_samples_0, exits(2, "--samples must be >= 1, got 0"),
                 id="cli-bench-samples-0"),
    pytest.param(cli_bench_calls_0, exits(2, "--calls must be >= 1, got 0"),
                 id="cli-bench-calls-0"),
    pytest.param(cli_bench_gemm_world_0, exits(2, "--world must be >= 1 (per-GPU K = K / world), "
                                               "got 0"), id="cli-bench-gemm-world-0"),
    pytest.param(cli_bench_gemm_comm_sms_200, exits(2, "--comm-sms values must be in [0, 130], "
                                                    "got 200"),
                 id="cli-bench-gemm-comm-sms-out-of-range"),
    pytest.param(cli_bench_gemm_k_not_multiple_of_8, exits(2, "--shapes 64x64x60: K=60 must split "
                                                           "over --world 2 into a multiple of 8 "
                                                           "per device"),
                 id="cli-bench-gemm-k-not-multiple-of-8"),
    pytest.param(cli_bench_overlap_world_negative, exits(2, "--world must be in [1, 1] (the "
                                                         "devices here; 0: all), got -1"),
                 id="cli-bench-world-negative"),
    pytest.param(cli_bench_overlap_world_too_large, exits(2, "--world must be in [1, 1]",
                                                          "got 2"),
                 id="cli-bench-world-more-than-devices"),
    pytest.param(cli_bench_a2a_k_not_multiple_of_8, exits(2, "all_gather needs K to be a "
                                                          "multiple of 8, got 60"),
                 id="cli-bench-a2a-k-not-multiple-of-8"),
    pytest.param(cli_bench_sweep_without_gpu, exits(2, "sweep: needs GPUs", "'cpu'"),
                 id="cli-bench-sweep-without-gpu"),
    pytest.param(cli_bench_overlap_unknown_variant, exits(2, "argument --variants",
                                                          "invalid choice: 'two-chunk'",
                                                          "two_chunk"),
                 id="cli-bench-overlap-unknown-variant"),
    pytest.param(cli_bench_out_a_directory, exits(2, "--out ", ": cannot write there (a "
                                                  "directory)", max_s=40),
                 id="cli-bench-out-a-directory"),
    pytest.param(cli_bench_out_under_a_file, exits(2, "--out ", "cannot write there (",
                                                   "a_file is not a directory)", max_s=40),
                 id="cli-bench-out-under-a-file"),
    pytest.param(cli_bench_plot_a_directory, exits(2, "--plot ", ": cannot write there (a "
                                                   "directory)", max_s=40),
                 id="cli-bench-plot-a-directory"),
    pytest.param(cli_bench_shapes_empty_field, exits(2, "argument --shapes",
                                                     "shape must be MxNxK", "'64xx64x64'"),
                 id="cli-bench-shapes-empty-field"),
    pytest.param(cli_bench_out_empty, exits(2, "--out: an empty path (leave --out out to write "
                                            "nothing)"), id="cli-bench-out-empty"),
    pytest.param(cli_bench_out_and_plot_one_file, exits(2, "--out and --plot name the same file",
                                                        "same.png"),
                 id="cli-bench-out-and-plot-one-file"),
    pytest.param(cli_bench_bad_switch, exits(2, "JAX_FLASHOVERLAP_TRANSPORT", "'pear'"),
                 id="cli-bench-bad-switch"),
    pytest.param(cli_tune_out_empty, exits(2, "--out: an empty path (leave --out out for the "
                                           "user config dir's file)"),
                 id="cli-tune-out-empty"),
    pytest.param(cli_tune_without_gpu, exits(2, "needs GPUs", "'cpu'"),
                 id="cli-tune-without-gpu"),
    pytest.param(cli_tune_max_error("nan"), exits(2, "--max-error must be a finite number > 0",
                                                  "got nan"), id="cli-tune-max-error-nan"),
    pytest.param(cli_tune_max_error("-1"), exits(2, "--max-error must be a finite number > 0",
                                                 "got -1.0"), id="cli-tune-max-error-negative"),
    pytest.param(cli_launch_n0, exits(2, "-n must be in [1, 256]"), id="cli-launch-n-0"),
    pytest.param(cli_launch_n_huge, exits(2, "-n must be in [1, 256] (processes on this machine), "
                                          "got 100000"), id="cli-launch-n-huge"),
    pytest.param(cli_launch_negative_timeout, exits(2, "--timeout must be a positive number of "
                                                    "seconds", "-1"),
                 id="cli-launch-negative-timeout"),
    pytest.param(cli_launch_child_exits_3, exits(3, "process 1 exited with 3; stopping the others",
                                                 "process 1 failing", max_s=40),
                 id="cli-launch-child-exits-3"),
    pytest.param(cli_launch_timeout, exits(124, "timeout after 5 s", max_s=40),
                 id="cli-launch-timeout"),
    pytest.param(cli_bench_plot_unknown_format, exits(2, "--plot ", "matplotlib cannot write "
                                                      "'.xyz' files; use one of", ".png",
                                                      max_s=40),
                 id="cli-bench-plot-unknown-format"),
    pytest.param(cli_bench_plot_without_matplotlib,
                 exits(2, "--plot ", "drawing needs matplotlib, which is not installed here "
                       "(pip install matplotlib), or leave --plot out", max_s=40),
                 id="cli-bench-plot-without-matplotlib"),
    pytest.param(cli_bench_launcher_variables_partial, exits(2, "num_processes "
                                                             "(JAX_FLASHOVERLAP_NUM_PROCESSES) "
                                                             "given but not", "give all three"),
                 id="cli-bench-launcher-variables-partial"),
    pytest.param(cli_bench_coordinator_without_port, exits(2, "coordinator_address "
                                                           "(JAX_FLASHOVERLAP_COORDINATOR) must be "
                                                           "HOST:PORT", "got 'localhost'"),
                 id="cli-bench-coordinator-without-port"),
    pytest.param(cli_stress_zero_calls, exits(2, "--calls must be >= 1, got 0"),
                 id="cli-stress-zero-calls"),
    pytest.param(cli_stress_dim_not_multiple_of_8, exits(2, "--dim 60", "must be a multiple of "
                                                         "8", max_s=60),
                 id="cli-stress-dim-not-multiple-of-8"),
    pytest.param(cli_stress_out_a_directory, exits(2, "--out ", "cannot write there (a "
                                                   "directory)"),
                 id="cli-stress-out-a-directory"),
    pytest.param(cli_stress_seed_too_large, exits(2, "--seed must be in [0, 2**32)"),
                 id="cli-stress-seed-too-large"),
    pytest.param(cli_fuzz_ops_need_two_devices, exits(2, "--ops all_to_all all_gather: these "
                                                      "ops need 2 or more devices"),
                 id="cli-fuzz-ops-need-two-devices"),
    pytest.param(cli_fuzz_seconds_nan, exits(2, "--seconds must be a number >= 0, got nan"),
                 id="cli-fuzz-seconds-nan"),
    pytest.param(cli_diagnose_hang_wait_infinite, exits(2, "--wait: must be a finite number of "
                                                        "seconds > 5, got 'inf'"),
                 id="cli-diagnose-hang-wait-infinite"),
    pytest.param(cli_diagnose_hang_without_nvidia_smi, exits(124, "still running after 6 s",
                                                             "no nvidia-smi on this machine",
                                                             max_s=60),
                 id="cli-diagnose-hang-without-nvidia-smi"),
    pytest.param(cli_diagnose_ffi_unknown_case, exits(2, "unknown case(s) nope; the cases: "
                                                      "bad_attr_first"),
                 id="cli-diagnose-ffi-unknown-case"),
    pytest.param(cli_diagnose_ffi_without_gpu, exits(2, "runs our FFI handlers on a GPU",
                                                     "'cpu'"),
                 id="cli-diagnose-ffi-without-gpu"),
    pytest.param(cli_first_call_overlap_without_gpu, exits(1, "needs a GPU and "
                                                           "FLASHOVERLAP_TRACE=1", "'cpu'"),
                 id="cli-first-call-overlap-without-gpu"),
    pytest.param(cli_gemm_in_jax_calls_0, exits(2, "--calls must be >= 1, got 0"),
                 id="cli-gemm-in-jax-calls-0"),
    pytest.param(cli_gemm_in_jax_without_gpu, exits(2, "gemm_in_jax.py: error: needs a GPU",
                                                    "'cpu'"),
                 id="cli-gemm-in-jax-without-gpu"),
    pytest.param(cli_epilogue_ab_without_gpu, exits(2, "epilogue_ab.py: error: needs a GPU",
                                                    "'cpu'"),
                 id="cli-epilogue-ab-without-gpu"),
    pytest.param(cli_epilogue_ab_epilogue_env_set, exits(2, "FLASHOVERLAP_GEMM_EPILOGUE is set "
                                                         "('sync')", "unset it"),
                 id="cli-epilogue-ab-epilogue-env-set"),
    pytest.param(cli_xla_dot_profile_without_gpu, exits(2, "xla_dot_profile.py: error: needs a "
                                                        "GPU"),
                 id="cli-xla-dot-profile-without-gpu"),
    pytest.param(cli_compile_variants_m_not_splittable, exits(2, "--m must be a positive even "
                                                              "number", "got 63"),
                 id="cli-compile-variants-m-not-splittable"),
    pytest.param(cli_trace_op_calls_0, exits(2, "--calls must be >= 1, got 0"),
                 id="cli-trace-op-calls-0"),
    pytest.param(cli_profile_gemms_without_arguments, exits(2, "usage: "
                                                            "benchmarks/profile_gemms.sh OUT_DIR"),
                 id="cli-profile-gemms-without-arguments"),
    pytest.param(cli_ncu_ab_without_ncu, exits(2, "needs Nsight Compute's ncu on PATH"),
                 id="cli-ncu-ab-without-ncu"),
    pytest.param(cli_ncu_ab_without_out, exits(2, "usage: ", "OUT=dir bash benchmarks/ncu_ab.sh",
                                               "set OUT"),
                 id="cli-ncu-ab-without-out"),
    # --- several processes ---
    pytest.param(dist_plan_mismatch_two_processes, exits(0, "process 0: DistributedMismatchError",
                                                         "the group plan differs between "
                                                         "processes", "process 1 has", max_s=80),
                 id="dist-plan-mismatch-2-processes"),
    pytest.param(dist_peer_never_arrives, raises(TimeoutError, "waited 2 s for process 1's value "
                                                 "of the group plan",
                                                 distributed.TIMEOUT_ENV),
                 id="dist-peer-never-arrives"),
    pytest.param(dist_shared_value_never_arrives,
                 raises(TimeoutError, "waited 2 s for the shared value "
                        "('jax_flashoverlap/uid/7/1/0') from process 1", distributed.TIMEOUT_ENV),
                 id="dist-shared-value-never-arrives"),
    pytest.param(dist_bad_timeout_env, raises(ValueError, distributed.TIMEOUT_ENV,
                                              "'five minutes'", "positive number of seconds"),
                 id="dist-bad-kv-timeout-env"),
    pytest.param(dist_kv_timeout_too_large, raises(ValueError, distributed.TIMEOUT_ENV,
                                                   "'3000000'", "of at most 2147483"),
                 id="dist-kv-timeout-too-large"),
    pytest.param(dist_store_type_error, raises(TypeError, "incompatible function arguments"),
                 id="dist-store-type-error-not-a-timeout"),
    pytest.param(dist_bad_num_processes_env, raises(ValueError, distributed.NUM_PROCESSES_ENV,
                                                    "'two'", "must be an integer"),
                 id="dist-bad-num-processes-env"),
    pytest.param(dist_launcher_env_partly_set, raises(ValueError, "num_processes "
                                                      f"({distributed.NUM_PROCESSES_ENV}), "
                                                      "process_id", "given but not "
                                                      "coordinator_address "
                                                      f"({distributed.COORDINATOR_ENV})"),
                 id="dist-launcher-env-partly-set"),
    pytest.param(dist_num_processes_negative, raises(ValueError, distributed.NUM_PROCESSES_ENV,
                                                     "must be >= 1, got -2"),
                 id="dist-num-processes-below-1"),
    pytest.param(dist_process_id_out_of_range, raises(ValueError, distributed.PROCESS_ID_ENV,
                                                      "must be in [0, 2)", "got 2"),
                 id="dist-process-id-out-of-range"),
    pytest.param(dist_not_initialized, raises(RuntimeError, "needs JAX's distributed runtime",
                                              "jax.distributed.initialize()"),
                 id="dist-not-initialized"),
    # --- unsupported GPU, missing extension, switches ---
    pytest.param(gpu_unsupported("NVIDIA A100-SXM4-80GB", "8.0"),
                 warns(_ext.UnsupportedGPUWarning, "needs an sm_90 GPU", "'NVIDIA A100-SXM4-80GB' "
                       "is sm_80", "reference path"), id="gpu-unsupported-sm80"),
    pytest.param(gpu_unsupported("NVIDIA B200", "10.0"),
                 warns(_ext.UnsupportedGPUWarning, "needs an sm_90 GPU", "is sm_100"),
                 id="gpu-unsupported-sm100"),
    pytest.param(ext_missing_with_gpu, warns(_ext.ExtensionMissingWarning, "a GPU is present but "
                                             "the CUDA extension is not built", "not built (test)"),
                 id="extension-missing-with-gpu"),
    pytest.param(env_force_reference_typo, raises(ValueError, _ext.FORCE_REFERENCE_ENV, "'ture'",
                                                  "is not an on/off switch"),
                 id="env-force-reference-typo"),
    pytest.param(env_fallback_typo, raises(ValueError, _ext.FALLBACK_ENV, "'of'",
                                           "is not an on/off switch"),
                 id="env-fallback-typo"),
    pytest.param(env_fallback_typo_overlapped, raises(ValueError, _ext.FALLBACK_ENV, "'of'",
                                                      "is not an on/off switch"),
                 id="env-fallback-typo-overlapped-shape"),
    pytest.param(env_watchdog_bad, raises(ValueError, "JAX_FLASHOVERLAP_WATCHDOG_S must be a "
                                          "number of seconds > 0", "'soon'"),
                 id="env-watchdog-not-a-number"),
    pytest.param(env_gemm_epilogue_typo, raises(ValueError, _ext.GEMM_EPILOGUE_ENV, "'snyc'",
                                                "must be 'overlap' (the default), 'sync'"),
                 id="env-gemm-epilogue-typo"),
    pytest.param(env_gemm_queue_typo, raises(ValueError, _ext.GEMM_QUEUE_ENV, "'dynamc'",
                                             "must be 'dynamic' (the default"),
                 id="env-gemm-queue-typo"),
    pytest.param(env_gemm_tail_typo, raises(ValueError, _ext.GEMM_TAIL_ENV, "'spilt'",
                                            "must be 'split' (the default"),
                 id="env-gemm-tail-typo"),
    pytest.param(env_gemm_schedule_typo, raises(ValueError, _ext.GEMM_SCHEDULE_ENV, "'ping-pong'",
                                                "must be 'cooperative' (the default"),
                 id="env-gemm-schedule-typo"),
    pytest.param(env_gemm_helpers_word, raises(ValueError, _ext.GEMM_HELPERS_ENV, "'1'",
                                               "must be 'off' (the default) or 'on'"),
                 id="env-gemm-helpers-word"),
    pytest.param(env_all_reduce_buffer_typo, raises(ValueError, _ext.ALL_REDUCE_BUFFER_ENV,
                                                    "'in_place'", "must be 'workspace'"),
                 id="env-all-reduce-buffer-typo"),
    pytest.param(env_transport_typo, raises(ValueError, _ext.TRANSPORT_ENV, "'nvlink'",
                                            "must be 'auto' (the default", "'nccl' (NCCL",
                                            "or 'peer'"),
                 id="env-transport-typo"),
    pytest.param(env_poison_outputs_typo, raises(ValueError, _ext.POISON_OUTPUTS_ENV, "'nan'",
                                                 "is not an on/off switch"),
                 id="env-poison-outputs-typo"),
    pytest.param(env_gemm_serpentine_word, raises(ValueError, "FLASHOVERLAP_GEMM_SERPENTINE='true'",
                                                  "must be 0 (", "or 1 (", "reads an integer"),
                 id="env-gemm-serpentine-word"),
    pytest.param(env_gemm_serpentine_non_ascii_digit,
                 raises(ValueError, "FLASHOVERLAP_GEMM_SERPENTINE='\u0661'", "must be 0 (",
                        "reads an integer"), id="env-gemm-serpentine-non-ascii-digit"),
    pytest.param(env_gemm_panel_zero, raises(ValueError, "FLASHOVERLAP_GEMM_PANEL='0'",
                                             "must be an integer in [1, 1024]"),
                 id="env-gemm-panel-zero"),
    pytest.param(env_gemm_tile_other, raises(ValueError, "FLASHOVERLAP_GEMM_TILE='64'",
                                             "must be 128 or 256"),
                 id="env-gemm-tile-other"),
    pytest.param(env_wait_typo, raises(ValueError, "JAX_FLASHOVERLAP_WAIT='spinn'",
                                       "must be 'spin'"),
                 id="env-wait-typo"),
    # --- plan overrides (jax_flashoverlap.plan.forced / plan_a2a.forced; tuning, benchmarks) ---
    pytest.param(plan_forced_overlap_not_bool, raises(TypeError, "forced(): overlap must be a "
                                                      "bool (False: XLA's dot + collective), "
                                                      "got 'false'"),
                 id="plan-forced-overlap-not-bool"),
    pytest.param(plan_forced_a2a_overlap_not_bool, raises(TypeError, "forced(): overlap must be "
                                                          "a bool", "got 'no'"),
                 id="plan-forced-a2a-overlap-not-bool"),
    pytest.param(plan_forced_band_rows_not_ints, raises(TypeError, "forced(): band_rows must be a "
                                                        "sequence of ints", "(0, 10.7, 64)"),
                 id="plan-forced-band-rows-not-ints"),
    pytest.param(plan_forced_all_gather_comm_sms_0, raises(ValueError, "forced comm_sms=0: the "
                                                           "all-gather's overlapped call needs "
                                                           "comm_sms >= 1"),
                 id="plan-forced-all-gather-comm-sms-0"),
]
