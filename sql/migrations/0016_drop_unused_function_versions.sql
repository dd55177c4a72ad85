-- 0016: the SQL function versions that neither this release nor the previous one calls go.
--
-- A changed transition gets a new function version in a new migration, and the old version
-- stays while a deployed worker may still call it: the schema is migrated first and the code
-- follows, so the release still running during an upgrade must keep working on the new schema
-- (media_hooks_tests/store/test_migrations.py). A version that not even the previous release
-- calls has no caller left. Each is named below with the migration that replaced it and the
-- last code that called it (the commit that stopped calling it is the first without it).
-- Nothing that tables, constraints, triggers or the remaining functions use is dropped.
-- keeps: every invariant (no statement that moves state changes; only unreachable code goes).

-- The worker's step before 0015's v4 (one limiter write per step): last called before f989c8b.
DROP FUNCTION IF EXISTS media_hooks_lease_with_permits_v3(
    text, text, double precision, double precision, double precision, double precision,
    integer[], text, text[], text[]);

-- The step before 0014's v3 (starts granted ahead): last called before 5fc1d75.
DROP FUNCTION IF EXISTS media_hooks_lease_with_permits_v2(
    text, text, double precision, double precision, double precision, integer[], text, text[],
    text[]);

-- The step before 0009's v2 (starts counted when leased): last called before 91c4a3e.
DROP FUNCTION IF EXISTS media_hooks_lease_with_permits_v1(
    text, text, double precision, double precision, double precision, integer[], text, text[],
    text[]);

-- The refund of a stale offer's permits inside v1 and v2 above; v4 refunds in its own pass.
DROP FUNCTION IF EXISTS media_hooks_refund_permits_v1(text, integer[], text);

-- The limiter's grant before 0014's acquire_permits_v2 (starts granted ahead): last called
-- before 5fc1d75.
DROP FUNCTION IF EXISTS media_hooks_acquire_permits_v1(
    text, integer, text, double precision, double precision, double precision, integer[]);

-- The lease before 0005's lease_v2 (an expired lease closed as ambiguous in the same
-- statement): last called before 8523ab7.
DROP FUNCTION IF EXISTS media_hooks_lease_v1(text, text[], text[], double precision);

-- The per-asset claim rule before 0013's held_by_v2, which the claim inlines: last named by
-- code before 1632201.
DROP FUNCTION IF EXISTS media_hooks_may_claim_v1(
    text, text, text, text, text, timestamp with time zone, bigint, text);
