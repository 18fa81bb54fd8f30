--
-- The binary form (binary protocol, COPY BINARY) is pgvector's:
-- int16 dim, int16 unused (0), then dim float4, all in network byte order.
-- The files are written and read by psql (\copy) in the results directory,
-- so the server needs no access to the build directory.
--

-- send: [1,-2] is 0002 0000 3f800000 c0000000; [0.5,-0,1e-45,3.4028235e38]
-- is 0004 0000 3f000000 80000000 00000001 7f7fffff
SELECT knn_vector_send('[1,-2]'::vector);
SELECT knn_vector_send('[0.5,-0,1e-45,3.4028235e38]'::vector);

-- round trip through a COPY BINARY file
CREATE TABLE copy_source (id int, v vector);
INSERT INTO copy_source VALUES (1, '[1,2,3]'), (2, '[-0,1e-45,3.4028235e38]'), (3, NULL),
	(4, '[0.1]'), (5, ('[' || repeat('-1.25,', 15999) || '7]')::vector);
\copy copy_source TO 'results/vector_copy_binary.bin' WITH (FORMAT binary)
CREATE TABLE copy_target (id int, v vector);
\copy copy_target FROM 'results/vector_copy_binary.bin' WITH (FORMAT binary)
-- every row back, bit for bit (-0 stays -0: compare the binary forms)
SELECT count(*) AS rows,
	count(*) FILTER (WHERE s.id IS NULL OR t.id IS NULL) AS unmatched,
	count(*) FILTER (WHERE knn_vector_send(s.v) IS DISTINCT FROM knn_vector_send(t.v)) AS different
FROM copy_source s FULL JOIN copy_target t ON s.id = t.id;
SELECT id, v FROM copy_target WHERE id <= 4 ORDER BY id;

-- a typmod is checked on input: row 4 ([0.1]) stops the load, nothing is kept
CREATE TABLE copy_typmod (id int, v vector(3));
\copy copy_typmod FROM 'results/vector_copy_binary.bin' WITH (FORMAT binary)
SELECT count(*) FROM copy_typmod;

-- Hand-made binary values: a bytea's binary form is its raw bytes, so a
-- COPY BINARY file of a bytea column loads its bytes as vectors.
CREATE TABLE copy_raw (v bytea);
CREATE TABLE copy_crafted (v vector);
INSERT INTO copy_raw VALUES ('\x000200003f800000c0000000'), ('\x0001000000000001');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
SELECT v FROM copy_crafted;

-- unused is not 0
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x000100013f800000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- no dimension
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x00000000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- 16001 dimensions (0x3e81)
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x3e8100003f800000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- 65535 dimensions: dim is read unsigned, as it is sent
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\xffff00003f800000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- NaN
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x000200003f8000007fc00000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- -Infinity
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x00010000ff800000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- fewer values than dim says
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x000200003f800000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- more bytes than dim says
TRUNCATE copy_raw;
INSERT INTO copy_raw VALUES ('\x000100003f8000003f800000');
\copy copy_raw TO 'results/vector_copy_raw.bin' WITH (FORMAT binary)
\copy copy_crafted FROM 'results/vector_copy_raw.bin' WITH (FORMAT binary)
-- none of the bad values was loaded
SELECT v FROM copy_crafted;

DROP TABLE copy_source, copy_target, copy_typmod, copy_raw, copy_crafted;
