-- ---------------------------------------------------------------------------
-- Upgrade from 0.2 to 0.3: first what changes among 0.2's objects; the
-- objects new in 0.3 follow (the install-script parts added since 0.2, see
-- the Makefile). sql/knn_upgrade.sql proves that a database updated from
-- 0.1 (through 0.2) has the same objects and definitions as a fresh install.
-- ---------------------------------------------------------------------------
\echo Use "ALTER EXTENSION knn_gpu UPDATE TO '0.3'" to load this file. \quit
