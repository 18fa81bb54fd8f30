-- ---------------------------------------------------------------------------
-- Upgrade from 0.1 to 0.2: first what changes among 0.1's objects; the
-- objects new in 0.2 follow (the install-script parts added since 0.1, see
-- the Makefile). sql/knn_upgrade.sql proves that an updated database has
-- the same objects and definitions as a fresh install.
-- ---------------------------------------------------------------------------
\echo Use "ALTER EXTENSION knn_gpu UPDATE TO '0.2'" to load this file. \quit
