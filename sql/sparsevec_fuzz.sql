--
-- A bounded, seeded fuzz run of the sparsevec type's input functions,
-- binary receive (knn_sparsevec_recv) above all, text input
-- (knn_sparsevec_in) too.
--
-- Inputs come from a seeded generator (setseed), so a run tries the same
-- inputs in the same order; it stops after a maximum number of inputs or a
-- time budget, whichever comes first, but always tries a minimum number
-- first, so that only pass/fail summaries are printed. Budget: about 6 s of
-- binary inputs and 3 s of text ones. The counts and times go to the server
-- log (RAISE LOG).
--
-- binary Each payload is judged by a reference written here in PL/pgSQL
--        from the binary form README documents (pgvector's): int32 dim,
--        int32 nnz, int32 unused, then nnz int32 indices (0-based), then
--        nnz float4 values, all big-endian, read in that order:
--        fewer than 12 bytes (08P01, insufficient data); dim below 1
--        (22000) or above 1000000000 (54000); nnz negative (22000), above
--        16000 or above dim (54000); a typmod that is not dim (22000);
--        unused not 0 (22000); then each index as it is read: the data
--        ending (08P01), outside 0..dim-1, not above its predecessor
--        (22000); then each value: the data ending (08P01), NaN, an
--        infinity or zero (22000); bytes left over (22P03, from COPY). An
--        accepted payload is sent back byte for byte, and reads back the
--        same through the text form.
-- text   No full reference (the real pgvector is one:
--        test/pgvector/sql/knn_pgvector_sparsevec.sql compares mutated
--        texts with it); every outcome is checked for what must hold: an
--        error is one of the input's SQLSTATEs (22P02, 22000, 22003, 54000);
--        an accepted value prints in the canonical form, reads back to the
--        same bytes, and its binary form passes the binary reference.
--
-- Route to the receive function (pg_temp.fuzz_copy_in, sql/fuzz_helpers.psql):
-- it takes 'internal', so each payload is written as a one-row COPY BINARY file of a bytea column (whose binary
-- form is its raw bytes) and loaded with COPY ... FROM (FORMAT binary) into
-- a table with a sparsevec column, which hands exactly those bytes to
-- knn_sparsevec_recv with the column's typmod. Both COPYs are server-side,
-- so the test needs a superuser (pg_regress's); the file is
-- sparsevec_fuzz.copy in the data directory, overwritten for each input. A
-- BEFORE INSERT trigger records what was received and keeps no row.
--

\i sql/fuzz_helpers.psql

CREATE SCHEMA sparsevec_fuzz;
CREATE TABLE sparsevec_fuzz.start AS
	SELECT pg_postmaster_start_time() AS started, pg_backend_pid() AS pid;
-- failures(kind, input, typmod, expected, actual): the first 20 of each kind
CREATE TABLE sparsevec_fuzz.failures (kind text, input text, typmod int, expected text, actual text);
CREATE TABLE sparsevec_fuzz.summary (kind text, inputs int, outcomes text[], mismatches int,
	wrong_sqlstate int, unexpected_sqlstate int, wrong_value int);

-- -------------------------------------------------------------- binary --

-- The signed big-endian int32 at byte offset o of p.
CREATE FUNCTION sparsevec_fuzz.i32(p bytea, o int) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
	SELECT (get_byte(p, o)::bigint * 16777216 + get_byte(p, o + 1) * 65536 + get_byte(p, o + 2) * 256 + get_byte(p, o + 3)
			- CASE WHEN get_byte(p, o) >= 128 THEN 4294967296 ELSE 0 END)::int $$;
-- The big-endian bytes of an int32 (given as any number type).
CREATE FUNCTION sparsevec_fuzz.be32(v float8) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT int4send(v::int) $$;

-- The reference: 'ok' or the expected SQLSTATE for payload p under typmod tm.
CREATE FUNCTION sparsevec_fuzz.ref_bin(p bytea, tm int) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
	len int := length(p);
	dim int;
	nnz int;
	previous int;
	index int;
	bits int;
BEGIN
	IF len < 12 THEN
		RETURN '08P01';			-- dim, nnz and unused are all read first
	END IF;
	dim := sparsevec_fuzz.i32(p, 0);
	nnz := sparsevec_fuzz.i32(p, 4);
	IF dim < 1 THEN
		RETURN '22000';
	ELSIF dim > 1000000000 THEN
		RETURN '54000';
	ELSIF nnz < 0 THEN
		RETURN '22000';
	ELSIF nnz > 16000 OR nnz > dim THEN
		RETURN '54000';
	ELSIF tm <> -1 AND tm <> dim THEN
		RETURN '22000';
	ELSIF sparsevec_fuzz.i32(p, 8) <> 0 THEN
		RETURN '22000';
	END IF;
	FOR k IN 0 .. nnz - 1 LOOP
		IF len < 16 + 4 * k THEN
			RETURN '08P01';
		END IF;
		index := sparsevec_fuzz.i32(p, 12 + 4 * k);
		IF index < 0 OR index >= dim OR (k > 0 AND index <= previous) THEN
			RETURN '22000';
		END IF;
		previous := index;
	END LOOP;
	FOR k IN 0 .. nnz - 1 LOOP
		IF len < 16 + 4 * nnz + 4 * k THEN
			RETURN '08P01';
		END IF;
		bits := sparsevec_fuzz.i32(p, 12 + 4 * nnz + 4 * k) & 2147483647;
		IF bits >= 2139095040 OR bits = 0 THEN		-- exponent all ones, or +-0
			RETURN '22000';
		END IF;
	END LOOP;
	IF len > 12 + 8 * nnz THEN
		RETURN '22P03';
	END IF;
	RETURN 'ok';
END $$;

-- Records what the receive function made of the row being loaded: its
-- binary form, and its binary form after a trip through the text form.
CREATE FUNCTION sparsevec_fuzz.capture() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('sparsevec_fuzz.received',
		encode(knn_sparsevec_send(NEW.v), 'hex') || ' ' || encode(knn_sparsevec_send(NEW.v::text::sparsevec), 'hex'), true);
	RETURN NULL;
END $$;
CREATE TABLE sparsevec_fuzz.bin_any (v sparsevec);
CREATE TABLE sparsevec_fuzz.bin_3 (v sparsevec(3));
CREATE TABLE sparsevec_fuzz.bin_1000 (v sparsevec(1000));
CREATE TRIGGER capture BEFORE INSERT ON sparsevec_fuzz.bin_any FOR EACH ROW EXECUTE FUNCTION sparsevec_fuzz.capture();
CREATE TRIGGER capture BEFORE INSERT ON sparsevec_fuzz.bin_3 FOR EACH ROW EXECUTE FUNCTION sparsevec_fuzz.capture();
CREATE TRIGGER capture BEFORE INSERT ON sparsevec_fuzz.bin_1000 FOR EACH ROW EXECUTE FUNCTION sparsevec_fuzz.capture();

-- A valid payload: dim dimensions, up to nnz distinct ascending indices
-- below dim, values of all magnitudes (never zero).
CREATE FUNCTION sparsevec_fuzz.make_bin(dim int, nnz int) RETURNS bytea
LANGUAGE plpgsql AS $$
DECLARE
	indices int[];
BEGIN
	SELECT coalesce(array_agg(DISTINCT j ORDER BY j), '{}') INTO indices
	FROM (SELECT floor(random() * dim)::int AS j FROM generate_series(1, nnz)) s;
	RETURN sparsevec_fuzz.be32(dim) || sparsevec_fuzz.be32(cardinality(indices)) || sparsevec_fuzz.be32(0)
		|| coalesce((SELECT string_agg(sparsevec_fuzz.be32(j), ''::bytea ORDER BY o)
					 FROM unnest(indices) WITH ORDINALITY u(j, o)), '')
		|| coalesce((SELECT string_agg(float4send(((random() - 0.5) * 10 ^ (random() * 60 - 30))::real + 1e-30::real), ''::bytea)
					 FROM generate_series(1, cardinality(indices))), '');
END $$;

-- 0..3 random edits: truncate; append 1..8 random bytes; set a random byte;
-- overwrite dim, nnz or unused with a value at an edge (0, 1, -1, nnz and
-- dim +- 1, 16000, 16001, 10^9, 10^9 + 1, the int32 extremes, random);
-- overwrite an index with one at an edge (its predecessor, the one below,
-- -1, dim - 1, dim, random); overwrite a value with a special bit pattern
-- (NaNs, infinities, +-0, subnormals, extremes); insert or delete 1..3
-- bytes somewhere (misaligning the rest).
CREATE FUNCTION sparsevec_fuzz.mutate_bin(p bytea, dim int, nnz int) RETURNS bytea
LANGUAGE plpgsql AS $$
DECLARE
	len int;
	pos int;
	k int;
	field int;
BEGIN
	FOR j IN 1 .. floor(random() * 4)::int LOOP
		len := length(p);
		pos := floor(random() * (len + 1))::int;
		k := 1 + floor(random() * 3)::int;
		CASE floor(random() * 8)::int
			WHEN 0 THEN
				p := pg_temp.fuzz_edit_bytes(p, 'truncate', pos, k);
			WHEN 1 THEN
				p := pg_temp.fuzz_edit_bytes(p, 'append', pos, k);
			WHEN 2 THEN
				p := pg_temp.fuzz_edit_bytes(p, 'set', pos, k);
			WHEN 3 THEN
				field := floor(random() * 3)::int;
				IF len >= 4 * field + 4 THEN
					p := overlay(p PLACING sparsevec_fuzz.be32((ARRAY[0, 1, -1, nnz - 1, nnz, nnz + 1, dim - 1, dim, dim + 1,
						16000, 16001, 1000000000, 1000000001, 2147483647, -2147483648,
						floor(random() * 4294967296) - 2147483648])[1 + floor(random() * 16)::int]) FROM 4 * field + 1 FOR 4);
				END IF;
			WHEN 4 THEN
				IF nnz > 0 AND len >= 12 + 4 * nnz THEN
					field := floor(random() * nnz)::int;
					p := overlay(p PLACING sparsevec_fuzz.be32((ARRAY[
						CASE WHEN field > 0 THEN sparsevec_fuzz.i32(p, 8 + 4 * field) ELSE 0 END,
						CASE WHEN field > 0 THEN sparsevec_fuzz.i32(p, 8 + 4 * field) - 1 ELSE -1 END,
						-1, dim - 1, dim, floor(random() * 4294967296) - 2147483648])[1 + floor(random() * 6)::int])
						FROM 13 + 4 * field FOR 4);
				END IF;
			WHEN 5 THEN
				IF nnz > 0 AND len >= 12 + 8 * nnz THEN
					p := overlay(p PLACING decode((ARRAY['7fc00000', 'ffc00000', '7f800001', '7fffffff',
						'7f800000', 'ff800000', '00000000', '80000000', '00000001', '80000001', '7f7fffff',
						'ff7fffff', '00800000'])[1 + floor(random() * 13)::int], 'hex')
						FROM 13 + 4 * nnz + 4 * floor(random() * nnz)::int FOR 4);
				END IF;
			WHEN 6 THEN
				IF len >= 12 THEN
					p := overlay(p PLACING sparsevec_fuzz.be32((ARRAY[1, -1, 256, floor(random() * 4294967296) - 2147483648])
						[1 + floor(random() * 4)::int]) FROM 9 FOR 4);
				END IF;
			ELSE
				p := pg_temp.fuzz_edit_bytes(p, 'shift', pos, k);
		END CASE;
	END LOOP;
	RETURN p;
END $$;

CREATE FUNCTION sparsevec_fuzz.note_failure(kind text, input text, tm int, expected text, actual text, failure text,
	INOUT nfail int[])
LANGUAGE plpgsql AS $$
DECLARE
	slot int := array_position(ARRAY['mismatch', 'wrong_sqlstate', 'unexpected_sqlstate', 'wrong_value'], failure);
BEGIN
	nfail[slot] := nfail[slot] + 1;
	IF (SELECT count(*) FROM sparsevec_fuzz.failures f WHERE f.kind = note_failure.kind) < 20 THEN
		INSERT INTO sparsevec_fuzz.failures VALUES (kind, left(input, 300), tm, left(expected, 300),
			left(actual, 300) || ' (' || failure || ')');
	END IF;
END $$;

CREATE FUNCTION sparsevec_fuzz.run_bin(min_inputs int, max_inputs int, max_seconds float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	-- tried first as they are (typmod in corpus_tm): every outcome appears
	corpus bytea[] := ARRAY[
		'\x00000005000000020000000000000000000000033fc00000c0000000',	-- ok
		'\x', '\x0000000500000000',										-- 08P01
		'\x000000050000000000000000',									-- ok, empty
		'\x000000000000000000000000', '\x3b9aca01000000000000000000',	-- dim 0, 10^9 + 1
		'\x0000000500000006000000000000000000000001',					-- nnz > dim
		'\x00000005000000010000000000000005',							-- index = dim
		'\x0000000500000002000000000000000300000001',					-- descending
		'\x00000005000000010000000000000001',							-- values missing
		'\x000000050000000100000000000000017fc00000',					-- NaN
		'\x0000000500000001000000000000000180000000',					-- -0
		'\x000000050000000000000001',									-- unused
		'\x00000005000000000000000000',									-- left over
		'\x000000030000000000000000', '\x000000050000000000000000']::bytea[];
	corpus_tm int[] := ARRAY[-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 3, 3];
	path text := current_setting('data_directory') || '/sparsevec_fuzz.copy';
	started timestamptz := clock_timestamp();
	i int := 0;
	p bytea;
	dim int;
	nnz int;
	tm int;
	ref text;
	got record;
	failure text;
	outcomes text[] := '{}';
	nfail int[] := '{0,0,0,0}';
BEGIN
	LOOP
		EXIT WHEN i >= max_inputs
			OR (i >= min_inputs AND clock_timestamp() - started > make_interval(secs => max_seconds));
		i := i + 1;
		IF i <= cardinality(corpus) THEN
			p := corpus[i];
			tm := corpus_tm[i];
		ELSE
			dim := (ARRAY[1, 2, 3, 3, 5, 8, 17, 100, 1000, 1000000000])[1 + floor(random() * 10)::int];
			p := sparsevec_fuzz.make_bin(dim, (ARRAY[0, 1, 2, 3, 4, 5, 9, 40])[1 + floor(random() * 8)::int]);
			nnz := sparsevec_fuzz.i32(p, 4);
			p := sparsevec_fuzz.mutate_bin(p, dim, nnz);
			tm := CASE WHEN random() < 0.7 THEN -1 ELSE (ARRAY[3, 1000])[1 + floor(random() * 2)::int] END;
		END IF;
		ref := sparsevec_fuzz.ref_bin(p, tm);
		got := pg_temp.fuzz_copy_in(p, 'sparsevec_fuzz.' || CASE WHEN tm = -1 THEN 'bin_any' ELSE 'bin_' || tm END, path,
			'sparsevec_fuzz.received');
		IF NOT got.state = ANY (outcomes) THEN
			outcomes := outcomes || got.state;
		END IF;
		failure := NULL;
		IF got.state = 'ok' AND ref = 'ok' THEN
			IF got.received <> encode(p, 'hex') || ' ' || encode(p, 'hex') THEN
				failure := 'wrong_value';
			END IF;
		ELSIF got.state NOT IN ('ok', '08P01', '22000', '22P03', '54000') THEN
			failure := 'unexpected_sqlstate';
		ELSIF (got.state = 'ok') <> (ref = 'ok') THEN
			failure := 'mismatch';
		ELSIF got.state <> ref THEN
			failure := 'wrong_sqlstate';
		END IF;
		IF failure IS NOT NULL THEN
			nfail := sparsevec_fuzz.note_failure('binary', encode(p, 'hex'), tm, ref,
										   got.state || ' ' || coalesce(got.received, ''), failure, nfail);
		END IF;
	END LOOP;
	INSERT INTO sparsevec_fuzz.summary VALUES ('binary', i, outcomes, nfail[1], nfail[2], nfail[3], nfail[4]);
	RAISE LOG 'sparsevec_fuzz: % binary inputs in % s', i,
		round(extract(epoch FROM clock_timestamp() - started)::numeric, 1);
END $$;

-- 400 inputs at least, 20000 at most, about 6 seconds
SELECT setseed(0.61);
SELECT sparsevec_fuzz.run_bin(400, 20000, 6);
-- no disagreement with the reference; every error an expected SQLSTATE;
-- acceptance and each kind of error were seen
SELECT mismatches, wrong_sqlstate, unexpected_sqlstate, wrong_value,
	outcomes @> '{ok,08P01,22000,22P03,54000}' AS all_outcomes_seen
FROM sparsevec_fuzz.summary WHERE kind = 'binary';
SELECT input, typmod, expected, actual FROM sparsevec_fuzz.failures WHERE kind = 'binary';

-- ---------------------------------------------------------------- text --

CREATE FUNCTION sparsevec_fuzz.try_text(s text, tm int, OUT state text, OUT v sparsevec)
LANGUAGE plpgsql AS $$
BEGIN
	v := knn_sparsevec_in(s::cstring, 'sparsevec'::regtype, tm);
	state := 'ok';
EXCEPTION WHEN OTHERS THEN
	state := SQLSTATE;
	v := NULL;
END $$;

CREATE FUNCTION sparsevec_fuzz.run_text(min_inputs int, max_inputs int, max_seconds float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	seeds text[] := ARRAY['{1:1,3:-2.5}/5', ' { 2 : 0.5 , 1 : 3e2 } / 3 ', '{}/1', '{ }/7', '{1:0,2:1}/2',
		'{5:1.5e-38,1:-3.4028235e38,3:0x1p-3}/1000000000', '{1:1e-45,2:-0}/2', '{10:1,9:2,8:3,7:4}/10',
		E'\t{\n1\r:\f2\x0B}/1'];
	pieces text[] := ARRAY['0', '1', '2', '9', '00', '.', 'e', 'e-', 'e+', '-', '+', '{', '}', '{{', '}}', ':', '::',
		',', ',,', '/', '//', ' ', E'\t', E'\n', 'nan', 'NaN', 'inf', '-Infinity', '0x', 'p', 'x', 'a', '[', ']',
		'e38', 'e39', 'e-45', 'e-46', '2147483647', '2147483648', '-2147483649', '1000000000', '1000000001',
		'99999999999999999999', '', '', ''];
	started timestamptz := clock_timestamp();
	i int := 0;
	s text;
	tm int;
	got record;
	dim_text text;
	failure text;
	outcomes text[] := '{}';
	nfail int[] := '{0,0,0,0}';
BEGIN
	-- long texts: 16000 elements (the most), and one comma too many
	seeds := seeds || ('{' || (SELECT string_agg(j || ':' || j, ',') FROM generate_series(1, 16000) j) || '}/16000');
	seeds := seeds || ('{' || (SELECT string_agg(j || ':' || j, ',') FROM generate_series(1, 16000) j) || ',}/16001');
	LOOP
		EXIT WHEN i >= max_inputs
			OR (i >= min_inputs AND clock_timestamp() - started > make_interval(secs => max_seconds));
		i := i + 1;
		IF i <= cardinality(seeds) THEN
			s := seeds[i];
		ELSE
			s := pg_temp.fuzz_mutate_text(seeds[1 + floor(random() * (cardinality(seeds) - 2))::int], pieces);
		END IF;
		tm := CASE WHEN random() < 0.8 THEN -1 ELSE (ARRAY[1, 3, 5])[1 + floor(random() * 3)::int] END;
		got := sparsevec_fuzz.try_text(s, tm);
		IF NOT got.state = ANY (outcomes) THEN
			outcomes := outcomes || got.state;
		END IF;
		failure := NULL;
		IF got.state = 'ok' THEN
			dim_text := substring(got.v::text from '/(\d+)$');
			IF got.v::text !~ '^\{(\d+:[-0-9.e+]+(,\d+:[-0-9.e+]+)*)?\}/\d+$'
				OR knn_sparsevec_send(got.v::text::sparsevec) <> knn_sparsevec_send(got.v)
				OR sparsevec_fuzz.ref_bin(knn_sparsevec_send(got.v), tm) <> 'ok'
				OR (tm <> -1 AND dim_text::int <> tm) THEN
				failure := 'wrong_value';
			END IF;
		ELSIF got.state NOT IN ('22P02', '22000', '22003', '54000') THEN
			failure := 'unexpected_sqlstate';
		END IF;
		IF failure IS NOT NULL THEN
			nfail := sparsevec_fuzz.note_failure('text', s, tm, 'see the header',
										   got.state || ' ' || coalesce(got.v::text, ''), failure, nfail);
		END IF;
	END LOOP;
	INSERT INTO sparsevec_fuzz.summary VALUES ('text', i, outcomes, nfail[1], nfail[2], nfail[3], nfail[4]);
	RAISE LOG 'sparsevec_fuzz: % text inputs in % s', i,
		round(extract(epoch FROM clock_timestamp() - started)::numeric, 1);
END $$;

-- 300 inputs at least, 200000 at most, about 3 seconds
SELECT sparsevec_fuzz.run_text(300, 200000, 3);
SELECT unexpected_sqlstate, wrong_value, outcomes @> '{ok,22P02,22000,22003,54000}' AS all_outcomes_seen
FROM sparsevec_fuzz.summary WHERE kind = 'text';
SELECT input, typmod, expected, actual FROM sparsevec_fuzz.failures WHERE kind = 'text';

-- ------------------------------------------------------------- after --

-- the server did not restart and this backend is the one that began
SELECT pg_postmaster_start_time() = started AS server_alive, pg_backend_pid() = pid AS same_backend
FROM sparsevec_fuzz.start;
SELECT '{1:1,3:3}/3'::sparsevec <-> '{2:2}/3' AS distance;

SET client_min_messages = warning;
DROP SCHEMA sparsevec_fuzz CASCADE;
