-- migrate: contract
-- 0035: the contract's names read every delivery and every attempt, whichever layout holds it.
--
-- 0034 left webhook_delivery and delivery_attempt naming the previous layout's tables (views
-- over webhook_delivery_v1 and delivery_attempt_v1, written through) for the previous release,
-- whose producers and workers wrote them by those names. Once no session of that release is
-- connected, the names become what docs/contract.md says they are: the views this release reads
-- (webhook_delivery_all, delivery_attempt_all), with the contract's columns and meaning. A
-- delivery still in the previous layout stays there until this release's sweeps move it
-- (pending) or retention purges it (ended); nothing is copied here.
--
-- A contract migration: the previous release reads and writes the previous layout by these
-- names, so `media-hooks db migrate` applies it once none of its sessions is connected.
--
-- keeps: invariants 3 and 9 (a lease the previous release left ends by its rule, its attempt
--   written ambiguous before anything can send the delivery again: after this migration that
--   rule, which reads the contract's name, could no longer reach it), 4 (the lease's token goes:
--   a worker of that release that comes back can record nothing).

SELECT count(*)
FROM media_hooks_end_leases_v1(
    ARRAY(SELECT d.delivery_id FROM webhook_delivery_v1 AS d WHERE d.state = 'leased'),
    false,
    'upgrade',
    'the release that leased it is gone; its lease ended without an outcome');

-- The previous release's cohort rule over this view's row (0034) goes with the view.
DROP FUNCTION media_hooks_in_cohort(webhook_delivery, text[], text[], text[], timestamptz,
                                   timestamptz);
DROP VIEW webhook_delivery;
CREATE VIEW webhook_delivery AS SELECT * FROM webhook_delivery_all;
-- Written as webhook_delivery_all is (an operator's fix by hand goes where the delivery is).
CREATE TRIGGER webhook_delivery_write
    INSTEAD OF INSERT OR UPDATE OR DELETE ON webhook_delivery
    FOR EACH ROW EXECUTE FUNCTION media_hooks_delivery_all_write_v1();

DROP VIEW delivery_attempt;
CREATE VIEW delivery_attempt AS SELECT * FROM delivery_attempt_all;

SELECT media_hooks_share_like_v1('webhook_delivery_v1', ARRAY['webhook_delivery',
                                                              'delivery_attempt']);
