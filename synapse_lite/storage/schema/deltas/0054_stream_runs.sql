-- How many times each stream kept in a writer's memory whose positions reach
-- clients (typing) has started afresh. Its writer takes the next run when it
-- starts and counts its positions from run * RUN_SPAN, so a /sync token of an
-- earlier run of the writer is recognised as such (docs/reliability.md).
CREATE TABLE stream_runs (
    stream_name TEXT NOT NULL PRIMARY KEY,
    run BIGINT NOT NULL
);
