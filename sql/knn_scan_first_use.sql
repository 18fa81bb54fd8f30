--
-- A fresh session, in which no knn_gpu function has run: planning the query
-- loads the library (through the distance functions' planner support
-- function), so the very first query is planned as a KNN Join.
--
CREATE TABLE knn_first_items (id int, v vector);
CREATE TABLE knn_first_queries (id int, v vector);
-- (Never analysed: the planner assumes a few pages of rows in each.)
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_first_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_first_items t ORDER BY t.v <=> q.v LIMIT 5) n;
DROP TABLE knn_first_items, knn_first_queries;
