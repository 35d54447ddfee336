#!/bin/sh
# Move the test files into folders mirroring src/egress's packages (TEST_MOVES.md).
# Run once from the repository root on a clean tree, after the helpers' branches are merged.
set -eu

# every new folder is a package: same basenames in two folders are then two modules
mkdir -p tests/e2e/cli && touch tests/e2e/cli/__init__.py && git add tests/e2e/cli/__init__.py
mkdir -p tests/e2e/connectors && touch tests/e2e/connectors/__init__.py && git add tests/e2e/connectors/__init__.py
mkdir -p tests/e2e/connectors/sinks && touch tests/e2e/connectors/sinks/__init__.py && git add tests/e2e/connectors/sinks/__init__.py
mkdir -p tests/e2e/connectors/sources && touch tests/e2e/connectors/sources/__init__.py && git add tests/e2e/connectors/sources/__init__.py
mkdir -p tests/e2e/firehose && touch tests/e2e/firehose/__init__.py && git add tests/e2e/firehose/__init__.py
mkdir -p tests/e2e/observe && touch tests/e2e/observe/__init__.py && git add tests/e2e/observe/__init__.py
mkdir -p tests/e2e/runtime && touch tests/e2e/runtime/__init__.py && git add tests/e2e/runtime/__init__.py
mkdir -p tests/e2e/throttler && touch tests/e2e/throttler/__init__.py && git add tests/e2e/throttler/__init__.py
mkdir -p tests/integration/cli && touch tests/integration/cli/__init__.py && git add tests/integration/cli/__init__.py
mkdir -p tests/integration/connectors && touch tests/integration/connectors/__init__.py && git add tests/integration/connectors/__init__.py
mkdir -p tests/integration/connectors/sinks && touch tests/integration/connectors/sinks/__init__.py && git add tests/integration/connectors/sinks/__init__.py
mkdir -p tests/integration/connectors/sources && touch tests/integration/connectors/sources/__init__.py && git add tests/integration/connectors/sources/__init__.py
mkdir -p tests/integration/engines && touch tests/integration/engines/__init__.py && git add tests/integration/engines/__init__.py
mkdir -p tests/integration/engines/nats && touch tests/integration/engines/nats/__init__.py && git add tests/integration/engines/nats/__init__.py
mkdir -p tests/integration/firehose && touch tests/integration/firehose/__init__.py && git add tests/integration/firehose/__init__.py
mkdir -p tests/integration/httpclient && touch tests/integration/httpclient/__init__.py && git add tests/integration/httpclient/__init__.py
mkdir -p tests/integration/observe && touch tests/integration/observe/__init__.py && git add tests/integration/observe/__init__.py
mkdir -p tests/integration/receiver && touch tests/integration/receiver/__init__.py && git add tests/integration/receiver/__init__.py
mkdir -p tests/integration/runtime && touch tests/integration/runtime/__init__.py && git add tests/integration/runtime/__init__.py
mkdir -p tests/integration/throttler && touch tests/integration/throttler/__init__.py && git add tests/integration/throttler/__init__.py
mkdir -p tests/unit/cli && touch tests/unit/cli/__init__.py && git add tests/unit/cli/__init__.py
mkdir -p tests/unit/connectors && touch tests/unit/connectors/__init__.py && git add tests/unit/connectors/__init__.py
mkdir -p tests/unit/connectors/sinks && touch tests/unit/connectors/sinks/__init__.py && git add tests/unit/connectors/sinks/__init__.py
mkdir -p tests/unit/connectors/sources && touch tests/unit/connectors/sources/__init__.py && git add tests/unit/connectors/sources/__init__.py
mkdir -p tests/unit/engines && touch tests/unit/engines/__init__.py && git add tests/unit/engines/__init__.py
mkdir -p tests/unit/engines/nats && touch tests/unit/engines/nats/__init__.py && git add tests/unit/engines/nats/__init__.py
mkdir -p tests/unit/firehose && touch tests/unit/firehose/__init__.py && git add tests/unit/firehose/__init__.py
mkdir -p tests/unit/httpclient && touch tests/unit/httpclient/__init__.py && git add tests/unit/httpclient/__init__.py
mkdir -p tests/unit/observe && touch tests/unit/observe/__init__.py && git add tests/unit/observe/__init__.py
mkdir -p tests/unit/runtime && touch tests/unit/runtime/__init__.py && git add tests/unit/runtime/__init__.py
mkdir -p tests/unit/spec && touch tests/unit/spec/__init__.py && git add tests/unit/spec/__init__.py
mkdir -p tests/unit/throttler && touch tests/unit/throttler/__init__.py && git add tests/unit/throttler/__init__.py

# the moves
git mv tests/unit/test_assignment.py tests/unit/runtime/test_assignment.py
git mv tests/unit/test_backoff.py tests/unit/httpclient/test_backoff.py
git mv tests/unit/test_batching_http_sink.py tests/unit/connectors/sinks/test_batching_http.py
git mv tests/unit/test_cli_main_flags.py tests/unit/cli/test_main_flags.py
git mv tests/unit/test_cli_spec_changes.py tests/unit/cli/test_spec_changes.py
git mv tests/unit/test_cluster_cli.py tests/unit/cli/test_processes.py
git mv tests/unit/test_cluster_drained.py tests/unit/runtime/test_drained.py
git mv tests/unit/test_dashboard.py tests/unit/observe/test_dashboard.py
git mv tests/unit/test_dead_letters.py tests/unit/connectors/test_dead_letters.py
git mv tests/unit/test_delivery_latency.py tests/unit/runtime/test_delivery_latency.py
git mv tests/unit/test_durations.py tests/unit/spec/test_durations.py
git mv tests/unit/test_epoch_step.py tests/unit/runtime/test_epoch_step.py
git mv tests/unit/test_firehose_asgi.py tests/unit/firehose/test_asgi.py
git mv tests/unit/test_firehose_cloudwatch.py tests/unit/firehose/test_cloudwatch.py
git mv tests/unit/test_firehose_protocol.py tests/unit/firehose/test_protocol.py
git mv tests/unit/test_firehose_retry.py tests/unit/firehose/test_retry.py
git mv tests/unit/test_firehose_sink_parameters.py tests/unit/connectors/sinks/test_firehose_parameters.py
git mv tests/unit/test_followed_files.py tests/unit/connectors/sources/test_follow.py
git mv tests/unit/test_http_outcomes.py tests/unit/httpclient/test_outcomes.py
git mv tests/unit/test_http_sink_dead_letters.py tests/unit/connectors/sinks/test_async_http_dead_letters.py
git mv tests/unit/test_http_sink_delivery.py tests/unit/connectors/sinks/test_async_http_delivery.py
git mv tests/unit/test_http_sink_parameters.py tests/unit/connectors/sinks/test_http_parameters.py
git mv tests/unit/test_http_sink_retry_after.py tests/unit/connectors/sinks/test_async_http_retry_after.py
git mv tests/unit/test_input_files_fuzz.py tests/unit/connectors/sources/test_input_files_fuzz.py
git mv tests/unit/test_layout.py tests/unit/runtime/test_layout.py
git mv tests/unit/test_live_inputs_examples.py tests/unit/runtime/test_live_inputs_examples.py
git mv tests/unit/test_map_function.py tests/unit/runtime/test_map_function.py
git mv tests/unit/test_nats_jetstream.py tests/unit/engines/nats/test_jetstream.py
git mv tests/unit/test_nats_leases.py tests/unit/engines/nats/test_leases.py
git mv tests/unit/test_nats_subjects.py tests/unit/engines/nats/test_subjects.py
git mv tests/unit/test_observe_logs.py tests/unit/observe/test_logs.py
git mv tests/unit/test_observe_metrics.py tests/unit/observe/test_metrics.py
git mv tests/unit/test_plan_validation.py tests/unit/runtime/test_plan_validation.py
git mv tests/unit/test_redirects.py tests/unit/httpclient/test_redirects.py
git mv tests/unit/test_redrive_cli.py tests/unit/cli/test_redrive.py
git mv tests/unit/test_retry_after.py tests/unit/httpclient/test_retry_after.py
git mv tests/unit/test_run_cli_messages.py tests/unit/cli/test_run_messages.py
git mv tests/unit/test_run_collector.py tests/unit/runtime/test_collector.py
git mv tests/unit/test_sink_holds.py tests/unit/runtime/test_holds.py
git mv tests/unit/test_sink_ordering.py tests/unit/connectors/sinks/test_ordering.py
git mv tests/unit/test_source_backlog.py tests/unit/runtime/test_source_backlog.py
git mv tests/unit/test_source_chunks_fuzz.py tests/unit/connectors/sources/test_chunks_fuzz.py
git mv tests/unit/test_source_reader.py tests/unit/runtime/test_source_reader.py
git mv tests/unit/test_sources.py tests/unit/connectors/sources/test_files.py
git mv tests/unit/test_spec_fuzz.py tests/unit/spec/test_fuzz.py
git mv tests/unit/test_spec_loading.py tests/unit/spec/test_loading.py
git mv tests/unit/test_spec_strict_values.py tests/unit/spec/test_strict_values.py
git mv tests/unit/test_sqlite_engine.py tests/unit/engines/test_sqlite.py
git mv tests/unit/test_state_clients.py tests/unit/runtime/test_state.py
git mv tests/unit/test_storage_errors.py tests/unit/engines/test_storage_errors.py
git mv tests/unit/test_throttle_stop.py tests/unit/throttler/test_stop.py
git mv tests/unit/test_throttler_bucket.py tests/unit/throttler/test_bucket.py
git mv tests/unit/test_throttler_cli.py tests/unit/cli/test_throttler.py
git mv tests/unit/test_throttler_client.py tests/unit/throttler/test_client.py
git mv tests/unit/test_throttler_controller.py tests/unit/throttler/test_controller.py
git mv tests/unit/test_throttler_envelope.py tests/unit/throttler/test_envelope.py
git mv tests/unit/test_throttler_fallback.py tests/unit/throttler/test_fallback.py
git mv tests/unit/test_throttler_models.py tests/unit/throttler/test_models.py
git mv tests/unit/test_throttler_properties.py tests/unit/throttler/test_properties.py
git mv tests/unit/test_throttler_saturation.py tests/unit/throttler/test_saturation.py
git mv tests/unit/test_throttler_scheduler.py tests/unit/throttler/test_scheduler.py
git mv tests/unit/test_throttler_shared_spec.py tests/unit/throttler/test_shared_spec.py
git mv tests/unit/test_throttler_throttling.py tests/unit/throttler/test_throttling.py
git mv tests/unit/test_timers_queue.py tests/unit/runtime/test_timers.py
git mv tests/unit/test_worker_spec_check.py tests/unit/runtime/test_worker_spec_check.py
git mv tests/integration/test_async_http_sink.py tests/integration/connectors/sinks/test_async_http.py
git mv tests/integration/test_async_http_sink_connections.py tests/integration/connectors/sinks/test_async_http_connections.py
git mv tests/integration/test_async_http_sink_retry_after.py tests/integration/connectors/sinks/test_async_http_retry_after.py
git mv tests/integration/test_bad_records.py tests/integration/connectors/sources/test_bad_records.py
git mv tests/integration/test_batching_http_kill.py tests/integration/connectors/sinks/test_batching_http_kill.py
git mv tests/integration/test_batching_http_sink.py tests/integration/connectors/sinks/test_batching_http.py
git mv tests/integration/test_cli_exits.py tests/integration/cli/test_exits.py
git mv tests/integration/test_curl_client.py tests/integration/httpclient/test_curl.py
git mv tests/integration/test_dead_letters.py tests/integration/connectors/test_dead_letters.py
git mv tests/integration/test_firehose_cli.py tests/integration/cli/test_firehose.py
git mv tests/integration/test_firehose_fuzz.py tests/integration/firehose/test_fuzz.py
git mv tests/integration/test_firehose_kill.py tests/integration/connectors/sinks/test_firehose_http_kill.py
git mv tests/integration/test_firehose_pipeline.py tests/integration/connectors/sinks/test_firehose_http_pipeline.py
git mv tests/integration/test_firehose_receiver.py tests/integration/firehose/test_receiver.py
git mv tests/integration/test_firehose_sink.py tests/integration/connectors/sinks/test_firehose_http.py
git mv tests/integration/test_http_source.py tests/integration/connectors/sources/test_http.py
git mv tests/integration/test_live_inputs_cluster.py tests/integration/runtime/test_live_inputs_cluster.py
git mv tests/integration/test_log_retention.py tests/integration/runtime/test_retention.py
git mv tests/integration/test_nats_engine.py tests/integration/engines/nats/test_engine.py
git mv tests/integration/test_nats_outages.py tests/integration/engines/nats/test_outages.py
git mv tests/integration/test_nats_source.py tests/integration/connectors/sources/test_nats.py
git mv tests/integration/test_network_partition.py tests/integration/runtime/test_network_partition.py
git mv tests/integration/test_observability.py tests/integration/observe/test_observability.py
git mv tests/integration/test_pipeline.py tests/integration/runtime/test_pipeline.py
git mv tests/integration/test_receiver.py tests/integration/receiver/test_app.py
git mv tests/integration/test_receiver_hold.py tests/integration/receiver/test_hold.py
git mv tests/integration/test_run_hints.py tests/integration/cli/test_run_hints.py
git mv tests/integration/test_run_imports.py tests/integration/cli/test_run_imports.py
git mv tests/integration/test_sink_contract.py tests/integration/connectors/sinks/test_contract.py
git mv tests/integration/test_source_unread.py tests/integration/connectors/sources/test_unread.py
git mv tests/integration/test_spec_changes.py tests/integration/runtime/test_spec_changes.py
git mv tests/integration/test_sqlite_pause.py tests/integration/engines/test_sqlite_pause.py
git mv tests/integration/test_state_pipeline.py tests/integration/runtime/test_state_pipeline.py
git mv tests/integration/test_throttle_interrupted.py tests/integration/runtime/test_throttle_interrupted.py
git mv tests/integration/test_throttled_pipeline.py tests/integration/runtime/test_throttled_pipeline.py
git mv tests/integration/test_throttler_election.py tests/integration/runtime/test_throttler_role.py
git mv tests/integration/test_throttler_http.py tests/integration/throttler/test_http_transport.py
git mv tests/integration/test_throttler_nats.py tests/integration/throttler/test_nats_transport.py
git mv tests/integration/test_worker_runtime.py tests/integration/runtime/test_worker.py
git mv tests/e2e/test_bad_record_fail_delivers.py tests/e2e/runtime/test_bad_record_fail_delivers.py
git mv tests/e2e/test_chaos.py tests/e2e/runtime/test_chaos.py
git mv tests/e2e/test_cluster_cli.py tests/e2e/cli/test_processes.py
git mv tests/e2e/test_cluster_faults.py tests/e2e/runtime/test_cluster_faults.py
git mv tests/e2e/test_cluster_freeze.py tests/e2e/runtime/test_cluster_freeze.py
git mv tests/e2e/test_cluster_start_over.py tests/e2e/runtime/test_cluster_start_over.py
git mv tests/e2e/test_cluster_throttler.py tests/e2e/throttler/test_cluster.py
git mv tests/e2e/test_dashboard.py tests/e2e/observe/test_dashboard.py
git mv tests/e2e/test_dead_letters_e2e.py tests/e2e/connectors/test_dead_letters.py
git mv tests/e2e/test_disk_full.py tests/e2e/runtime/test_disk_full.py
git mv tests/e2e/test_exactly_once.py tests/e2e/runtime/test_exactly_once.py
git mv tests/e2e/test_firehose_example.py tests/e2e/firehose/test_example.py
git mv tests/e2e/test_follow_kill_restart.py tests/e2e/connectors/sources/test_follow_kill_restart.py
git mv tests/e2e/test_http_sink_e2e.py tests/e2e/connectors/sinks/test_async_http.py
git mv tests/e2e/test_http_source_cluster.py tests/e2e/connectors/sources/test_http_cluster.py
git mv tests/e2e/test_http_source_kill_restart.py tests/e2e/connectors/sources/test_http_kill_restart.py
git mv tests/e2e/test_interrupt.py tests/e2e/runtime/test_interrupt.py
git mv tests/e2e/test_kill_restart.py tests/e2e/runtime/test_kill_restart.py
git mv tests/e2e/test_nats_source_kill_restart.py tests/e2e/connectors/sources/test_nats_kill_restart.py
git mv tests/e2e/test_nats_source_unreachable.py tests/e2e/connectors/sources/test_nats_unreachable.py
git mv tests/e2e/test_observability_e2e.py tests/e2e/observe/test_observability.py
git mv tests/e2e/test_processes_log_retention.py tests/e2e/runtime/test_processes_log_retention.py
git mv tests/e2e/test_run_in_a_pipe.py tests/e2e/cli/test_run_in_a_pipe.py
git mv tests/e2e/test_spec_change.py tests/e2e/runtime/test_spec_change.py
git mv tests/e2e/test_stop_on_error.py tests/e2e/runtime/test_stop_on_error.py
git mv tests/e2e/test_throttler_example.py tests/e2e/throttler/test_example.py
git mv tests/e2e/test_throttler_interrupt.py tests/e2e/throttler/test_interrupt.py
git mv tests/e2e/test_throttler_service.py tests/e2e/throttler/test_service.py
git mv tests/e2e/test_throttler_shared_runs.py tests/e2e/throttler/test_shared_runs.py
git mv tests/e2e/test_throttler_weighted_saturation.py tests/e2e/throttler/test_weighted_saturation.py

# references to the moved modules, by path (docs, docstrings) and by dotted name (imports)
git grep -lz -e 'tests/unit/test_assignment.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_assignment\.py#tests/unit/runtime/test_assignment.py#g'
git grep -lzw -e 'tests.unit.test_assignment' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_assignment\b#tests.unit.runtime.test_assignment#g'
git grep -lz -e 'tests/unit/test_backoff.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_backoff\.py#tests/unit/httpclient/test_backoff.py#g'
git grep -lzw -e 'tests.unit.test_backoff' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_backoff\b#tests.unit.httpclient.test_backoff#g'
git grep -lz -e 'tests/unit/test_batching_http_sink.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_batching_http_sink\.py#tests/unit/connectors/sinks/test_batching_http.py#g'
git grep -lzw -e 'tests.unit.test_batching_http_sink' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_batching_http_sink\b#tests.unit.connectors.sinks.test_batching_http#g'
git grep -lz -e 'tests/unit/test_cli_main_flags.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_cli_main_flags\.py#tests/unit/cli/test_main_flags.py#g'
git grep -lzw -e 'tests.unit.test_cli_main_flags' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_cli_main_flags\b#tests.unit.cli.test_main_flags#g'
git grep -lz -e 'tests/unit/test_cli_spec_changes.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_cli_spec_changes\.py#tests/unit/cli/test_spec_changes.py#g'
git grep -lzw -e 'tests.unit.test_cli_spec_changes' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_cli_spec_changes\b#tests.unit.cli.test_spec_changes#g'
git grep -lz -e 'tests/unit/test_cluster_cli.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_cluster_cli\.py#tests/unit/cli/test_processes.py#g'
git grep -lzw -e 'tests.unit.test_cluster_cli' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_cluster_cli\b#tests.unit.cli.test_processes#g'
git grep -lz -e 'tests/unit/test_cluster_drained.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_cluster_drained\.py#tests/unit/runtime/test_drained.py#g'
git grep -lzw -e 'tests.unit.test_cluster_drained' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_cluster_drained\b#tests.unit.runtime.test_drained#g'
git grep -lz -e 'tests/unit/test_dashboard.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_dashboard\.py#tests/unit/observe/test_dashboard.py#g'
git grep -lzw -e 'tests.unit.test_dashboard' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_dashboard\b#tests.unit.observe.test_dashboard#g'
git grep -lz -e 'tests/unit/test_dead_letters.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_dead_letters\.py#tests/unit/connectors/test_dead_letters.py#g'
git grep -lzw -e 'tests.unit.test_dead_letters' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_dead_letters\b#tests.unit.connectors.test_dead_letters#g'
git grep -lz -e 'tests/unit/test_delivery_latency.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_delivery_latency\.py#tests/unit/runtime/test_delivery_latency.py#g'
git grep -lzw -e 'tests.unit.test_delivery_latency' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_delivery_latency\b#tests.unit.runtime.test_delivery_latency#g'
git grep -lz -e 'tests/unit/test_durations.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_durations\.py#tests/unit/spec/test_durations.py#g'
git grep -lzw -e 'tests.unit.test_durations' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_durations\b#tests.unit.spec.test_durations#g'
git grep -lz -e 'tests/unit/test_epoch_step.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_epoch_step\.py#tests/unit/runtime/test_epoch_step.py#g'
git grep -lzw -e 'tests.unit.test_epoch_step' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_epoch_step\b#tests.unit.runtime.test_epoch_step#g'
git grep -lz -e 'tests/unit/test_firehose_asgi.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_firehose_asgi\.py#tests/unit/firehose/test_asgi.py#g'
git grep -lzw -e 'tests.unit.test_firehose_asgi' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_firehose_asgi\b#tests.unit.firehose.test_asgi#g'
git grep -lz -e 'tests/unit/test_firehose_cloudwatch.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_firehose_cloudwatch\.py#tests/unit/firehose/test_cloudwatch.py#g'
git grep -lzw -e 'tests.unit.test_firehose_cloudwatch' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_firehose_cloudwatch\b#tests.unit.firehose.test_cloudwatch#g'
git grep -lz -e 'tests/unit/test_firehose_protocol.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_firehose_protocol\.py#tests/unit/firehose/test_protocol.py#g'
git grep -lzw -e 'tests.unit.test_firehose_protocol' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_firehose_protocol\b#tests.unit.firehose.test_protocol#g'
git grep -lz -e 'tests/unit/test_firehose_retry.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_firehose_retry\.py#tests/unit/firehose/test_retry.py#g'
git grep -lzw -e 'tests.unit.test_firehose_retry' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_firehose_retry\b#tests.unit.firehose.test_retry#g'
git grep -lz -e 'tests/unit/test_firehose_sink_parameters.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_firehose_sink_parameters\.py#tests/unit/connectors/sinks/test_firehose_parameters.py#g'
git grep -lzw -e 'tests.unit.test_firehose_sink_parameters' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_firehose_sink_parameters\b#tests.unit.connectors.sinks.test_firehose_parameters#g'
git grep -lz -e 'tests/unit/test_followed_files.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_followed_files\.py#tests/unit/connectors/sources/test_follow.py#g'
git grep -lzw -e 'tests.unit.test_followed_files' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_followed_files\b#tests.unit.connectors.sources.test_follow#g'
git grep -lz -e 'tests/unit/test_http_outcomes.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_http_outcomes\.py#tests/unit/httpclient/test_outcomes.py#g'
git grep -lzw -e 'tests.unit.test_http_outcomes' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_http_outcomes\b#tests.unit.httpclient.test_outcomes#g'
git grep -lz -e 'tests/unit/test_http_sink_dead_letters.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_http_sink_dead_letters\.py#tests/unit/connectors/sinks/test_async_http_dead_letters.py#g'
git grep -lzw -e 'tests.unit.test_http_sink_dead_letters' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_http_sink_dead_letters\b#tests.unit.connectors.sinks.test_async_http_dead_letters#g'
git grep -lz -e 'tests/unit/test_http_sink_delivery.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_http_sink_delivery\.py#tests/unit/connectors/sinks/test_async_http_delivery.py#g'
git grep -lzw -e 'tests.unit.test_http_sink_delivery' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_http_sink_delivery\b#tests.unit.connectors.sinks.test_async_http_delivery#g'
git grep -lz -e 'tests/unit/test_http_sink_parameters.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_http_sink_parameters\.py#tests/unit/connectors/sinks/test_http_parameters.py#g'
git grep -lzw -e 'tests.unit.test_http_sink_parameters' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_http_sink_parameters\b#tests.unit.connectors.sinks.test_http_parameters#g'
git grep -lz -e 'tests/unit/test_http_sink_retry_after.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_http_sink_retry_after\.py#tests/unit/connectors/sinks/test_async_http_retry_after.py#g'
git grep -lzw -e 'tests.unit.test_http_sink_retry_after' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_http_sink_retry_after\b#tests.unit.connectors.sinks.test_async_http_retry_after#g'
git grep -lz -e 'tests/unit/test_input_files_fuzz.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_input_files_fuzz\.py#tests/unit/connectors/sources/test_input_files_fuzz.py#g'
git grep -lzw -e 'tests.unit.test_input_files_fuzz' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_input_files_fuzz\b#tests.unit.connectors.sources.test_input_files_fuzz#g'
git grep -lz -e 'tests/unit/test_layout.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_layout\.py#tests/unit/runtime/test_layout.py#g'
git grep -lzw -e 'tests.unit.test_layout' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_layout\b#tests.unit.runtime.test_layout#g'
git grep -lz -e 'tests/unit/test_live_inputs_examples.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_live_inputs_examples\.py#tests/unit/runtime/test_live_inputs_examples.py#g'
git grep -lzw -e 'tests.unit.test_live_inputs_examples' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_live_inputs_examples\b#tests.unit.runtime.test_live_inputs_examples#g'
git grep -lz -e 'tests/unit/test_map_function.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_map_function\.py#tests/unit/runtime/test_map_function.py#g'
git grep -lzw -e 'tests.unit.test_map_function' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_map_function\b#tests.unit.runtime.test_map_function#g'
git grep -lz -e 'tests/unit/test_nats_jetstream.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_nats_jetstream\.py#tests/unit/engines/nats/test_jetstream.py#g'
git grep -lzw -e 'tests.unit.test_nats_jetstream' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_nats_jetstream\b#tests.unit.engines.nats.test_jetstream#g'
git grep -lz -e 'tests/unit/test_nats_leases.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_nats_leases\.py#tests/unit/engines/nats/test_leases.py#g'
git grep -lzw -e 'tests.unit.test_nats_leases' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_nats_leases\b#tests.unit.engines.nats.test_leases#g'
git grep -lz -e 'tests/unit/test_nats_subjects.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_nats_subjects\.py#tests/unit/engines/nats/test_subjects.py#g'
git grep -lzw -e 'tests.unit.test_nats_subjects' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_nats_subjects\b#tests.unit.engines.nats.test_subjects#g'
git grep -lz -e 'tests/unit/test_observe_logs.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_observe_logs\.py#tests/unit/observe/test_logs.py#g'
git grep -lzw -e 'tests.unit.test_observe_logs' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_observe_logs\b#tests.unit.observe.test_logs#g'
git grep -lz -e 'tests/unit/test_observe_metrics.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_observe_metrics\.py#tests/unit/observe/test_metrics.py#g'
git grep -lzw -e 'tests.unit.test_observe_metrics' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_observe_metrics\b#tests.unit.observe.test_metrics#g'
git grep -lz -e 'tests/unit/test_plan_validation.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_plan_validation\.py#tests/unit/runtime/test_plan_validation.py#g'
git grep -lzw -e 'tests.unit.test_plan_validation' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_plan_validation\b#tests.unit.runtime.test_plan_validation#g'
git grep -lz -e 'tests/unit/test_redirects.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_redirects\.py#tests/unit/httpclient/test_redirects.py#g'
git grep -lzw -e 'tests.unit.test_redirects' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_redirects\b#tests.unit.httpclient.test_redirects#g'
git grep -lz -e 'tests/unit/test_redrive_cli.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_redrive_cli\.py#tests/unit/cli/test_redrive.py#g'
git grep -lzw -e 'tests.unit.test_redrive_cli' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_redrive_cli\b#tests.unit.cli.test_redrive#g'
git grep -lz -e 'tests/unit/test_retry_after.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_retry_after\.py#tests/unit/httpclient/test_retry_after.py#g'
git grep -lzw -e 'tests.unit.test_retry_after' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_retry_after\b#tests.unit.httpclient.test_retry_after#g'
git grep -lz -e 'tests/unit/test_run_cli_messages.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_run_cli_messages\.py#tests/unit/cli/test_run_messages.py#g'
git grep -lzw -e 'tests.unit.test_run_cli_messages' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_run_cli_messages\b#tests.unit.cli.test_run_messages#g'
git grep -lz -e 'tests/unit/test_run_collector.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_run_collector\.py#tests/unit/runtime/test_collector.py#g'
git grep -lzw -e 'tests.unit.test_run_collector' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_run_collector\b#tests.unit.runtime.test_collector#g'
git grep -lz -e 'tests/unit/test_sink_holds.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_sink_holds\.py#tests/unit/runtime/test_holds.py#g'
git grep -lzw -e 'tests.unit.test_sink_holds' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_sink_holds\b#tests.unit.runtime.test_holds#g'
git grep -lz -e 'tests/unit/test_sink_ordering.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_sink_ordering\.py#tests/unit/connectors/sinks/test_ordering.py#g'
git grep -lzw -e 'tests.unit.test_sink_ordering' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_sink_ordering\b#tests.unit.connectors.sinks.test_ordering#g'
git grep -lz -e 'tests/unit/test_source_backlog.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_source_backlog\.py#tests/unit/runtime/test_source_backlog.py#g'
git grep -lzw -e 'tests.unit.test_source_backlog' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_source_backlog\b#tests.unit.runtime.test_source_backlog#g'
git grep -lz -e 'tests/unit/test_source_chunks_fuzz.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_source_chunks_fuzz\.py#tests/unit/connectors/sources/test_chunks_fuzz.py#g'
git grep -lzw -e 'tests.unit.test_source_chunks_fuzz' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_source_chunks_fuzz\b#tests.unit.connectors.sources.test_chunks_fuzz#g'
git grep -lz -e 'tests/unit/test_source_reader.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_source_reader\.py#tests/unit/runtime/test_source_reader.py#g'
git grep -lzw -e 'tests.unit.test_source_reader' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_source_reader\b#tests.unit.runtime.test_source_reader#g'
git grep -lz -e 'tests/unit/test_sources.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_sources\.py#tests/unit/connectors/sources/test_files.py#g'
git grep -lzw -e 'tests.unit.test_sources' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_sources\b#tests.unit.connectors.sources.test_files#g'
git grep -lz -e 'tests/unit/test_spec_fuzz.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_spec_fuzz\.py#tests/unit/spec/test_fuzz.py#g'
git grep -lzw -e 'tests.unit.test_spec_fuzz' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_spec_fuzz\b#tests.unit.spec.test_fuzz#g'
git grep -lz -e 'tests/unit/test_spec_loading.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_spec_loading\.py#tests/unit/spec/test_loading.py#g'
git grep -lzw -e 'tests.unit.test_spec_loading' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_spec_loading\b#tests.unit.spec.test_loading#g'
git grep -lz -e 'tests/unit/test_spec_strict_values.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_spec_strict_values\.py#tests/unit/spec/test_strict_values.py#g'
git grep -lzw -e 'tests.unit.test_spec_strict_values' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_spec_strict_values\b#tests.unit.spec.test_strict_values#g'
git grep -lz -e 'tests/unit/test_sqlite_engine.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_sqlite_engine\.py#tests/unit/engines/test_sqlite.py#g'
git grep -lzw -e 'tests.unit.test_sqlite_engine' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_sqlite_engine\b#tests.unit.engines.test_sqlite#g'
git grep -lz -e 'tests/unit/test_state_clients.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_state_clients\.py#tests/unit/runtime/test_state.py#g'
git grep -lzw -e 'tests.unit.test_state_clients' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_state_clients\b#tests.unit.runtime.test_state#g'
git grep -lz -e 'tests/unit/test_storage_errors.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_storage_errors\.py#tests/unit/engines/test_storage_errors.py#g'
git grep -lzw -e 'tests.unit.test_storage_errors' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_storage_errors\b#tests.unit.engines.test_storage_errors#g'
git grep -lz -e 'tests/unit/test_throttle_stop.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttle_stop\.py#tests/unit/throttler/test_stop.py#g'
git grep -lzw -e 'tests.unit.test_throttle_stop' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttle_stop\b#tests.unit.throttler.test_stop#g'
git grep -lz -e 'tests/unit/test_throttler_bucket.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_bucket\.py#tests/unit/throttler/test_bucket.py#g'
git grep -lzw -e 'tests.unit.test_throttler_bucket' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_bucket\b#tests.unit.throttler.test_bucket#g'
git grep -lz -e 'tests/unit/test_throttler_cli.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_cli\.py#tests/unit/cli/test_throttler.py#g'
git grep -lzw -e 'tests.unit.test_throttler_cli' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_cli\b#tests.unit.cli.test_throttler#g'
git grep -lz -e 'tests/unit/test_throttler_client.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_client\.py#tests/unit/throttler/test_client.py#g'
git grep -lzw -e 'tests.unit.test_throttler_client' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_client\b#tests.unit.throttler.test_client#g'
git grep -lz -e 'tests/unit/test_throttler_controller.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_controller\.py#tests/unit/throttler/test_controller.py#g'
git grep -lzw -e 'tests.unit.test_throttler_controller' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_controller\b#tests.unit.throttler.test_controller#g'
git grep -lz -e 'tests/unit/test_throttler_envelope.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_envelope\.py#tests/unit/throttler/test_envelope.py#g'
git grep -lzw -e 'tests.unit.test_throttler_envelope' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_envelope\b#tests.unit.throttler.test_envelope#g'
git grep -lz -e 'tests/unit/test_throttler_fallback.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_fallback\.py#tests/unit/throttler/test_fallback.py#g'
git grep -lzw -e 'tests.unit.test_throttler_fallback' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_fallback\b#tests.unit.throttler.test_fallback#g'
git grep -lz -e 'tests/unit/test_throttler_models.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_models\.py#tests/unit/throttler/test_models.py#g'
git grep -lzw -e 'tests.unit.test_throttler_models' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_models\b#tests.unit.throttler.test_models#g'
git grep -lz -e 'tests/unit/test_throttler_properties.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_properties\.py#tests/unit/throttler/test_properties.py#g'
git grep -lzw -e 'tests.unit.test_throttler_properties' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_properties\b#tests.unit.throttler.test_properties#g'
git grep -lz -e 'tests/unit/test_throttler_saturation.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_saturation\.py#tests/unit/throttler/test_saturation.py#g'
git grep -lzw -e 'tests.unit.test_throttler_saturation' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_saturation\b#tests.unit.throttler.test_saturation#g'
git grep -lz -e 'tests/unit/test_throttler_scheduler.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_scheduler\.py#tests/unit/throttler/test_scheduler.py#g'
git grep -lzw -e 'tests.unit.test_throttler_scheduler' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_scheduler\b#tests.unit.throttler.test_scheduler#g'
git grep -lz -e 'tests/unit/test_throttler_shared_spec.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_shared_spec\.py#tests/unit/throttler/test_shared_spec.py#g'
git grep -lzw -e 'tests.unit.test_throttler_shared_spec' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_shared_spec\b#tests.unit.throttler.test_shared_spec#g'
git grep -lz -e 'tests/unit/test_throttler_throttling.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_throttler_throttling\.py#tests/unit/throttler/test_throttling.py#g'
git grep -lzw -e 'tests.unit.test_throttler_throttling' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_throttler_throttling\b#tests.unit.throttler.test_throttling#g'
git grep -lz -e 'tests/unit/test_timers_queue.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_timers_queue\.py#tests/unit/runtime/test_timers.py#g'
git grep -lzw -e 'tests.unit.test_timers_queue' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_timers_queue\b#tests.unit.runtime.test_timers#g'
git grep -lz -e 'tests/unit/test_worker_spec_check.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/unit/test_worker_spec_check\.py#tests/unit/runtime/test_worker_spec_check.py#g'
git grep -lzw -e 'tests.unit.test_worker_spec_check' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.unit\.test_worker_spec_check\b#tests.unit.runtime.test_worker_spec_check#g'
git grep -lz -e 'tests/integration/test_async_http_sink.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_async_http_sink\.py#tests/integration/connectors/sinks/test_async_http.py#g'
git grep -lzw -e 'tests.integration.test_async_http_sink' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_async_http_sink\b#tests.integration.connectors.sinks.test_async_http#g'
git grep -lz -e 'tests/integration/test_async_http_sink_connections.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_async_http_sink_connections\.py#tests/integration/connectors/sinks/test_async_http_connections.py#g'
git grep -lzw -e 'tests.integration.test_async_http_sink_connections' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_async_http_sink_connections\b#tests.integration.connectors.sinks.test_async_http_connections#g'
git grep -lz -e 'tests/integration/test_async_http_sink_retry_after.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_async_http_sink_retry_after\.py#tests/integration/connectors/sinks/test_async_http_retry_after.py#g'
git grep -lzw -e 'tests.integration.test_async_http_sink_retry_after' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_async_http_sink_retry_after\b#tests.integration.connectors.sinks.test_async_http_retry_after#g'
git grep -lz -e 'tests/integration/test_bad_records.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_bad_records\.py#tests/integration/connectors/sources/test_bad_records.py#g'
git grep -lzw -e 'tests.integration.test_bad_records' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_bad_records\b#tests.integration.connectors.sources.test_bad_records#g'
git grep -lz -e 'tests/integration/test_batching_http_kill.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_batching_http_kill\.py#tests/integration/connectors/sinks/test_batching_http_kill.py#g'
git grep -lzw -e 'tests.integration.test_batching_http_kill' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_batching_http_kill\b#tests.integration.connectors.sinks.test_batching_http_kill#g'
git grep -lz -e 'tests/integration/test_batching_http_sink.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_batching_http_sink\.py#tests/integration/connectors/sinks/test_batching_http.py#g'
git grep -lzw -e 'tests.integration.test_batching_http_sink' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_batching_http_sink\b#tests.integration.connectors.sinks.test_batching_http#g'
git grep -lz -e 'tests/integration/test_cli_exits.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_cli_exits\.py#tests/integration/cli/test_exits.py#g'
git grep -lzw -e 'tests.integration.test_cli_exits' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_cli_exits\b#tests.integration.cli.test_exits#g'
git grep -lz -e 'tests/integration/test_curl_client.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_curl_client\.py#tests/integration/httpclient/test_curl.py#g'
git grep -lzw -e 'tests.integration.test_curl_client' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_curl_client\b#tests.integration.httpclient.test_curl#g'
git grep -lz -e 'tests/integration/test_dead_letters.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_dead_letters\.py#tests/integration/connectors/test_dead_letters.py#g'
git grep -lzw -e 'tests.integration.test_dead_letters' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_dead_letters\b#tests.integration.connectors.test_dead_letters#g'
git grep -lz -e 'tests/integration/test_firehose_cli.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_firehose_cli\.py#tests/integration/cli/test_firehose.py#g'
git grep -lzw -e 'tests.integration.test_firehose_cli' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_firehose_cli\b#tests.integration.cli.test_firehose#g'
git grep -lz -e 'tests/integration/test_firehose_fuzz.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_firehose_fuzz\.py#tests/integration/firehose/test_fuzz.py#g'
git grep -lzw -e 'tests.integration.test_firehose_fuzz' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_firehose_fuzz\b#tests.integration.firehose.test_fuzz#g'
git grep -lz -e 'tests/integration/test_firehose_kill.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_firehose_kill\.py#tests/integration/connectors/sinks/test_firehose_http_kill.py#g'
git grep -lzw -e 'tests.integration.test_firehose_kill' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_firehose_kill\b#tests.integration.connectors.sinks.test_firehose_http_kill#g'
git grep -lz -e 'tests/integration/test_firehose_pipeline.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_firehose_pipeline\.py#tests/integration/connectors/sinks/test_firehose_http_pipeline.py#g'
git grep -lzw -e 'tests.integration.test_firehose_pipeline' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_firehose_pipeline\b#tests.integration.connectors.sinks.test_firehose_http_pipeline#g'
git grep -lz -e 'tests/integration/test_firehose_receiver.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_firehose_receiver\.py#tests/integration/firehose/test_receiver.py#g'
git grep -lzw -e 'tests.integration.test_firehose_receiver' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_firehose_receiver\b#tests.integration.firehose.test_receiver#g'
git grep -lz -e 'tests/integration/test_firehose_sink.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_firehose_sink\.py#tests/integration/connectors/sinks/test_firehose_http.py#g'
git grep -lzw -e 'tests.integration.test_firehose_sink' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_firehose_sink\b#tests.integration.connectors.sinks.test_firehose_http#g'
git grep -lz -e 'tests/integration/test_http_source.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_http_source\.py#tests/integration/connectors/sources/test_http.py#g'
git grep -lzw -e 'tests.integration.test_http_source' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_http_source\b#tests.integration.connectors.sources.test_http#g'
git grep -lz -e 'tests/integration/test_live_inputs_cluster.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_live_inputs_cluster\.py#tests/integration/runtime/test_live_inputs_cluster.py#g'
git grep -lzw -e 'tests.integration.test_live_inputs_cluster' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_live_inputs_cluster\b#tests.integration.runtime.test_live_inputs_cluster#g'
git grep -lz -e 'tests/integration/test_log_retention.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_log_retention\.py#tests/integration/runtime/test_retention.py#g'
git grep -lzw -e 'tests.integration.test_log_retention' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_log_retention\b#tests.integration.runtime.test_retention#g'
git grep -lz -e 'tests/integration/test_nats_engine.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_nats_engine\.py#tests/integration/engines/nats/test_engine.py#g'
git grep -lzw -e 'tests.integration.test_nats_engine' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_nats_engine\b#tests.integration.engines.nats.test_engine#g'
git grep -lz -e 'tests/integration/test_nats_outages.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_nats_outages\.py#tests/integration/engines/nats/test_outages.py#g'
git grep -lzw -e 'tests.integration.test_nats_outages' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_nats_outages\b#tests.integration.engines.nats.test_outages#g'
git grep -lz -e 'tests/integration/test_nats_source.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_nats_source\.py#tests/integration/connectors/sources/test_nats.py#g'
git grep -lzw -e 'tests.integration.test_nats_source' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_nats_source\b#tests.integration.connectors.sources.test_nats#g'
git grep -lz -e 'tests/integration/test_network_partition.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_network_partition\.py#tests/integration/runtime/test_network_partition.py#g'
git grep -lzw -e 'tests.integration.test_network_partition' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_network_partition\b#tests.integration.runtime.test_network_partition#g'
git grep -lz -e 'tests/integration/test_observability.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_observability\.py#tests/integration/observe/test_observability.py#g'
git grep -lzw -e 'tests.integration.test_observability' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_observability\b#tests.integration.observe.test_observability#g'
git grep -lz -e 'tests/integration/test_pipeline.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_pipeline\.py#tests/integration/runtime/test_pipeline.py#g'
git grep -lzw -e 'tests.integration.test_pipeline' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_pipeline\b#tests.integration.runtime.test_pipeline#g'
git grep -lz -e 'tests/integration/test_receiver.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_receiver\.py#tests/integration/receiver/test_app.py#g'
git grep -lzw -e 'tests.integration.test_receiver' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_receiver\b#tests.integration.receiver.test_app#g'
git grep -lz -e 'tests/integration/test_receiver_hold.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_receiver_hold\.py#tests/integration/receiver/test_hold.py#g'
git grep -lzw -e 'tests.integration.test_receiver_hold' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_receiver_hold\b#tests.integration.receiver.test_hold#g'
git grep -lz -e 'tests/integration/test_run_hints.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_run_hints\.py#tests/integration/cli/test_run_hints.py#g'
git grep -lzw -e 'tests.integration.test_run_hints' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_run_hints\b#tests.integration.cli.test_run_hints#g'
git grep -lz -e 'tests/integration/test_run_imports.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_run_imports\.py#tests/integration/cli/test_run_imports.py#g'
git grep -lzw -e 'tests.integration.test_run_imports' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_run_imports\b#tests.integration.cli.test_run_imports#g'
git grep -lz -e 'tests/integration/test_sink_contract.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_sink_contract\.py#tests/integration/connectors/sinks/test_contract.py#g'
git grep -lzw -e 'tests.integration.test_sink_contract' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_sink_contract\b#tests.integration.connectors.sinks.test_contract#g'
git grep -lz -e 'tests/integration/test_source_unread.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_source_unread\.py#tests/integration/connectors/sources/test_unread.py#g'
git grep -lzw -e 'tests.integration.test_source_unread' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_source_unread\b#tests.integration.connectors.sources.test_unread#g'
git grep -lz -e 'tests/integration/test_spec_changes.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_spec_changes\.py#tests/integration/runtime/test_spec_changes.py#g'
git grep -lzw -e 'tests.integration.test_spec_changes' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_spec_changes\b#tests.integration.runtime.test_spec_changes#g'
git grep -lz -e 'tests/integration/test_sqlite_pause.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_sqlite_pause\.py#tests/integration/engines/test_sqlite_pause.py#g'
git grep -lzw -e 'tests.integration.test_sqlite_pause' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_sqlite_pause\b#tests.integration.engines.test_sqlite_pause#g'
git grep -lz -e 'tests/integration/test_state_pipeline.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_state_pipeline\.py#tests/integration/runtime/test_state_pipeline.py#g'
git grep -lzw -e 'tests.integration.test_state_pipeline' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_state_pipeline\b#tests.integration.runtime.test_state_pipeline#g'
git grep -lz -e 'tests/integration/test_throttle_interrupted.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_throttle_interrupted\.py#tests/integration/runtime/test_throttle_interrupted.py#g'
git grep -lzw -e 'tests.integration.test_throttle_interrupted' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_throttle_interrupted\b#tests.integration.runtime.test_throttle_interrupted#g'
git grep -lz -e 'tests/integration/test_throttled_pipeline.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_throttled_pipeline\.py#tests/integration/runtime/test_throttled_pipeline.py#g'
git grep -lzw -e 'tests.integration.test_throttled_pipeline' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_throttled_pipeline\b#tests.integration.runtime.test_throttled_pipeline#g'
git grep -lz -e 'tests/integration/test_throttler_election.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_throttler_election\.py#tests/integration/runtime/test_throttler_role.py#g'
git grep -lzw -e 'tests.integration.test_throttler_election' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_throttler_election\b#tests.integration.runtime.test_throttler_role#g'
git grep -lz -e 'tests/integration/test_throttler_http.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_throttler_http\.py#tests/integration/throttler/test_http_transport.py#g'
git grep -lzw -e 'tests.integration.test_throttler_http' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_throttler_http\b#tests.integration.throttler.test_http_transport#g'
git grep -lz -e 'tests/integration/test_throttler_nats.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_throttler_nats\.py#tests/integration/throttler/test_nats_transport.py#g'
git grep -lzw -e 'tests.integration.test_throttler_nats' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_throttler_nats\b#tests.integration.throttler.test_nats_transport#g'
git grep -lz -e 'tests/integration/test_worker_runtime.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/integration/test_worker_runtime\.py#tests/integration/runtime/test_worker.py#g'
git grep -lzw -e 'tests.integration.test_worker_runtime' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.integration\.test_worker_runtime\b#tests.integration.runtime.test_worker#g'
git grep -lz -e 'tests/e2e/test_bad_record_fail_delivers.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_bad_record_fail_delivers\.py#tests/e2e/runtime/test_bad_record_fail_delivers.py#g'
git grep -lzw -e 'tests.e2e.test_bad_record_fail_delivers' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_bad_record_fail_delivers\b#tests.e2e.runtime.test_bad_record_fail_delivers#g'
git grep -lz -e 'tests/e2e/test_chaos.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_chaos\.py#tests/e2e/runtime/test_chaos.py#g'
git grep -lzw -e 'tests.e2e.test_chaos' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_chaos\b#tests.e2e.runtime.test_chaos#g'
git grep -lz -e 'tests/e2e/test_cluster_cli.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_cluster_cli\.py#tests/e2e/cli/test_processes.py#g'
git grep -lzw -e 'tests.e2e.test_cluster_cli' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_cluster_cli\b#tests.e2e.cli.test_processes#g'
git grep -lz -e 'tests/e2e/test_cluster_faults.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_cluster_faults\.py#tests/e2e/runtime/test_cluster_faults.py#g'
git grep -lzw -e 'tests.e2e.test_cluster_faults' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_cluster_faults\b#tests.e2e.runtime.test_cluster_faults#g'
git grep -lz -e 'tests/e2e/test_cluster_freeze.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_cluster_freeze\.py#tests/e2e/runtime/test_cluster_freeze.py#g'
git grep -lzw -e 'tests.e2e.test_cluster_freeze' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_cluster_freeze\b#tests.e2e.runtime.test_cluster_freeze#g'
git grep -lz -e 'tests/e2e/test_cluster_start_over.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_cluster_start_over\.py#tests/e2e/runtime/test_cluster_start_over.py#g'
git grep -lzw -e 'tests.e2e.test_cluster_start_over' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_cluster_start_over\b#tests.e2e.runtime.test_cluster_start_over#g'
git grep -lz -e 'tests/e2e/test_cluster_throttler.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_cluster_throttler\.py#tests/e2e/throttler/test_cluster.py#g'
git grep -lzw -e 'tests.e2e.test_cluster_throttler' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_cluster_throttler\b#tests.e2e.throttler.test_cluster#g'
git grep -lz -e 'tests/e2e/test_dashboard.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_dashboard\.py#tests/e2e/observe/test_dashboard.py#g'
git grep -lzw -e 'tests.e2e.test_dashboard' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_dashboard\b#tests.e2e.observe.test_dashboard#g'
git grep -lz -e 'tests/e2e/test_dead_letters_e2e.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_dead_letters_e2e\.py#tests/e2e/connectors/test_dead_letters.py#g'
git grep -lzw -e 'tests.e2e.test_dead_letters_e2e' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_dead_letters_e2e\b#tests.e2e.connectors.test_dead_letters#g'
git grep -lz -e 'tests/e2e/test_disk_full.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_disk_full\.py#tests/e2e/runtime/test_disk_full.py#g'
git grep -lzw -e 'tests.e2e.test_disk_full' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_disk_full\b#tests.e2e.runtime.test_disk_full#g'
git grep -lz -e 'tests/e2e/test_exactly_once.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_exactly_once\.py#tests/e2e/runtime/test_exactly_once.py#g'
git grep -lzw -e 'tests.e2e.test_exactly_once' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_exactly_once\b#tests.e2e.runtime.test_exactly_once#g'
git grep -lz -e 'tests/e2e/test_firehose_example.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_firehose_example\.py#tests/e2e/firehose/test_example.py#g'
git grep -lzw -e 'tests.e2e.test_firehose_example' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_firehose_example\b#tests.e2e.firehose.test_example#g'
git grep -lz -e 'tests/e2e/test_follow_kill_restart.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_follow_kill_restart\.py#tests/e2e/connectors/sources/test_follow_kill_restart.py#g'
git grep -lzw -e 'tests.e2e.test_follow_kill_restart' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_follow_kill_restart\b#tests.e2e.connectors.sources.test_follow_kill_restart#g'
git grep -lz -e 'tests/e2e/test_http_sink_e2e.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_http_sink_e2e\.py#tests/e2e/connectors/sinks/test_async_http.py#g'
git grep -lzw -e 'tests.e2e.test_http_sink_e2e' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_http_sink_e2e\b#tests.e2e.connectors.sinks.test_async_http#g'
git grep -lz -e 'tests/e2e/test_http_source_cluster.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_http_source_cluster\.py#tests/e2e/connectors/sources/test_http_cluster.py#g'
git grep -lzw -e 'tests.e2e.test_http_source_cluster' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_http_source_cluster\b#tests.e2e.connectors.sources.test_http_cluster#g'
git grep -lz -e 'tests/e2e/test_http_source_kill_restart.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_http_source_kill_restart\.py#tests/e2e/connectors/sources/test_http_kill_restart.py#g'
git grep -lzw -e 'tests.e2e.test_http_source_kill_restart' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_http_source_kill_restart\b#tests.e2e.connectors.sources.test_http_kill_restart#g'
git grep -lz -e 'tests/e2e/test_interrupt.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_interrupt\.py#tests/e2e/runtime/test_interrupt.py#g'
git grep -lzw -e 'tests.e2e.test_interrupt' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_interrupt\b#tests.e2e.runtime.test_interrupt#g'
git grep -lz -e 'tests/e2e/test_kill_restart.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_kill_restart\.py#tests/e2e/runtime/test_kill_restart.py#g'
git grep -lzw -e 'tests.e2e.test_kill_restart' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_kill_restart\b#tests.e2e.runtime.test_kill_restart#g'
git grep -lz -e 'tests/e2e/test_nats_source_kill_restart.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_nats_source_kill_restart\.py#tests/e2e/connectors/sources/test_nats_kill_restart.py#g'
git grep -lzw -e 'tests.e2e.test_nats_source_kill_restart' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_nats_source_kill_restart\b#tests.e2e.connectors.sources.test_nats_kill_restart#g'
git grep -lz -e 'tests/e2e/test_nats_source_unreachable.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_nats_source_unreachable\.py#tests/e2e/connectors/sources/test_nats_unreachable.py#g'
git grep -lzw -e 'tests.e2e.test_nats_source_unreachable' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_nats_source_unreachable\b#tests.e2e.connectors.sources.test_nats_unreachable#g'
git grep -lz -e 'tests/e2e/test_observability_e2e.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_observability_e2e\.py#tests/e2e/observe/test_observability.py#g'
git grep -lzw -e 'tests.e2e.test_observability_e2e' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_observability_e2e\b#tests.e2e.observe.test_observability#g'
git grep -lz -e 'tests/e2e/test_processes_log_retention.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_processes_log_retention\.py#tests/e2e/runtime/test_processes_log_retention.py#g'
git grep -lzw -e 'tests.e2e.test_processes_log_retention' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_processes_log_retention\b#tests.e2e.runtime.test_processes_log_retention#g'
git grep -lz -e 'tests/e2e/test_run_in_a_pipe.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_run_in_a_pipe\.py#tests/e2e/cli/test_run_in_a_pipe.py#g'
git grep -lzw -e 'tests.e2e.test_run_in_a_pipe' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_run_in_a_pipe\b#tests.e2e.cli.test_run_in_a_pipe#g'
git grep -lz -e 'tests/e2e/test_spec_change.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_spec_change\.py#tests/e2e/runtime/test_spec_change.py#g'
git grep -lzw -e 'tests.e2e.test_spec_change' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_spec_change\b#tests.e2e.runtime.test_spec_change#g'
git grep -lz -e 'tests/e2e/test_stop_on_error.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_stop_on_error\.py#tests/e2e/runtime/test_stop_on_error.py#g'
git grep -lzw -e 'tests.e2e.test_stop_on_error' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_stop_on_error\b#tests.e2e.runtime.test_stop_on_error#g'
git grep -lz -e 'tests/e2e/test_throttler_example.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_throttler_example\.py#tests/e2e/throttler/test_example.py#g'
git grep -lzw -e 'tests.e2e.test_throttler_example' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_throttler_example\b#tests.e2e.throttler.test_example#g'
git grep -lz -e 'tests/e2e/test_throttler_interrupt.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_throttler_interrupt\.py#tests/e2e/throttler/test_interrupt.py#g'
git grep -lzw -e 'tests.e2e.test_throttler_interrupt' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_throttler_interrupt\b#tests.e2e.throttler.test_interrupt#g'
git grep -lz -e 'tests/e2e/test_throttler_service.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_throttler_service\.py#tests/e2e/throttler/test_service.py#g'
git grep -lzw -e 'tests.e2e.test_throttler_service' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_throttler_service\b#tests.e2e.throttler.test_service#g'
git grep -lz -e 'tests/e2e/test_throttler_shared_runs.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_throttler_shared_runs\.py#tests/e2e/throttler/test_shared_runs.py#g'
git grep -lzw -e 'tests.e2e.test_throttler_shared_runs' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_throttler_shared_runs\b#tests.e2e.throttler.test_shared_runs#g'
git grep -lz -e 'tests/e2e/test_throttler_weighted_saturation.py' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#tests/e2e/test_throttler_weighted_saturation\.py#tests/e2e/throttler/test_weighted_saturation.py#g'
git grep -lzw -e 'tests.e2e.test_throttler_weighted_saturation' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' | xargs -0 -r sed -i 's#\btests\.e2e\.test_throttler_weighted_saturation\b#tests.e2e.throttler.test_weighted_saturation#g'

# a glob over the moved async_http sink tests, in a docstring
sed -i 's#tests/integration/test_async_http_sink\*\.py#tests/integration/connectors/sinks/test_async_http*.py#' tests/unit/connectors/sinks/test_async_http_delivery.py

# the imports of the moved modules, sorted again
${RUFF:-.venv/bin/ruff} check --fix --select I -q tests

# what still names an old place (expect nothing but this script and TEST_MOVES.md)
git grep -nE 'tests[/.](unit|integration|e2e)[/.](test_assignment|test_async_http_sink|test_async_http_sink_connections|test_async_http_sink_retry_after|test_backoff|test_bad_record_fail_delivers|test_bad_records|test_batching_http_kill|test_batching_http_sink|test_chaos|test_cli_exits|test_cli_main_flags|test_cli_spec_changes|test_cluster_cli|test_cluster_drained|test_cluster_faults|test_cluster_freeze|test_cluster_start_over|test_cluster_throttler|test_curl_client|test_dashboard|test_dead_letters|test_dead_letters_e2e|test_delivery_latency|test_disk_full|test_durations|test_epoch_step|test_exactly_once|test_firehose_asgi|test_firehose_cli|test_firehose_cloudwatch|test_firehose_example|test_firehose_fuzz|test_firehose_kill|test_firehose_pipeline|test_firehose_protocol|test_firehose_receiver|test_firehose_retry|test_firehose_sink|test_firehose_sink_parameters|test_follow_kill_restart|test_followed_files|test_http_outcomes|test_http_sink_dead_letters|test_http_sink_delivery|test_http_sink_e2e|test_http_sink_parameters|test_http_sink_retry_after|test_http_source|test_http_source_cluster|test_http_source_kill_restart|test_input_files_fuzz|test_interrupt|test_kill_restart|test_layout|test_live_inputs_cluster|test_live_inputs_examples|test_log_retention|test_map_function|test_nats_engine|test_nats_jetstream|test_nats_leases|test_nats_outages|test_nats_source|test_nats_source_kill_restart|test_nats_source_unreachable|test_nats_subjects|test_network_partition|test_observability|test_observability_e2e|test_observe_logs|test_observe_metrics|test_pipeline|test_plan_validation|test_processes_log_retention|test_receiver|test_receiver_hold|test_redirects|test_redrive_cli|test_retry_after|test_run_cli_messages|test_run_collector|test_run_hints|test_run_imports|test_run_in_a_pipe|test_sink_contract|test_sink_holds|test_sink_ordering|test_source_backlog|test_source_chunks_fuzz|test_source_reader|test_source_unread|test_sources|test_spec_change|test_spec_changes|test_spec_fuzz|test_spec_loading|test_spec_strict_values|test_sqlite_engine|test_sqlite_pause|test_state_clients|test_state_pipeline|test_stop_on_error|test_storage_errors|test_throttle_interrupted|test_throttle_stop|test_throttled_pipeline|test_throttler_bucket|test_throttler_cli|test_throttler_client|test_throttler_controller|test_throttler_election|test_throttler_envelope|test_throttler_example|test_throttler_fallback|test_throttler_http|test_throttler_interrupt|test_throttler_models|test_throttler_nats|test_throttler_properties|test_throttler_saturation|test_throttler_scheduler|test_throttler_service|test_throttler_shared_runs|test_throttler_shared_spec|test_throttler_throttling|test_throttler_weighted_saturation|test_timers_queue|test_worker_runtime|test_worker_spec_check)\b' -- . ':!tests_moves.sh' ':!TEST_MOVES.md' || true
