--
-- A bounded, seeded fuzz run of the vector type's two input functions:
-- text input (knn_vector_in) and binary receive (knn_vector_recv).
--
-- Every input comes from a seeded generator (setseed(0.42) and random()), so
-- a run always tries the same inputs in the same order; a run stops after a
-- maximum number of inputs or after a time budget, whichever comes first,
-- but always tries a minimum number first (the fixed corpus below and the
-- first mutations), so that the output does not depend on the machine's
-- speed: only pass/fail summaries are printed. Budget: about 9 s of text
-- inputs and 6 s of binary ones (some 5000 and 12000 on 2 cores). The number
-- of inputs tried and the time taken go to the server log (RAISE LOG).
--
-- Each input is checked against an independent reference written here in
-- PL/pgSQL from the documented rules (README: the text form and binary form
-- are pgvector's), which predicts acceptance or the SQLSTATE of the error:
--
-- text   optional blanks (space, \t, \n, \r, \v, \f), '[', then 1..16000
--        elements separated by ',', each one a number as float4in reads it
--        (decimal, exponent, hex float, 'inf', 'nan', ...) with blanks
--        around it, then ']' and optional blanks. Rejected: no '[' (22P02),
--        nothing between the brackets (22000), an element float4in rejects
--        (22P02), NaN or an infinity (22000), a number beyond the float4
--        range (22003), more than 16000 elements (54000), anything else
--        (22P02), a typmod vector(n) with n not the count (22000). Like
--        pgvector, a number below the smallest float4 subnormal reads as
--        (signed) zero, where float4in would complain. The value of each
--        element is what float4in gives (bit for bit: compared through
--        float4send), the output is what float4out prints for each element,
--        and output -> input gives the same bits back.
--        The reference splits the contents at ',' and ']' and judges each
--        piece as a whole; the input function reads a number with strtof
--        and then expects ',' or ']'. Both reject the same inputs, but for
--        a piece like 'nan x' or '1e39x' the input function stops at the
--        number it could read and reports it (22000 or 22003), where the
--        reference says 22P02; both answers are accepted there.
-- binary int16 dim, int16 unused, dim float4, all big-endian (as pgvector's
--        vector_recv): fewer than 4 bytes (08P01, insufficient data), dim
--        read unsigned and outside 1..16000 (22000 for 0, 54000 above), a
--        typmod that is not dim (22000), unused not 0 (22000), then the
--        elements in order: a NaN or infinite one (22000) or the data ending
--        early (08P01), whichever comes first; bytes left over (22P03, from
--        COPY). An accepted value sends back exactly the bytes received.
--
-- Route to the receive function (pg_temp.fuzz_copy_in, sql/fuzz_helpers.psql):
-- it takes 'internal' and cannot be called from SQL, so each binary input is
-- written as a one-row COPY BINARY file of a bytea column (a bytea's binary form is its raw bytes), which is then
-- loaded with COPY ... FROM (FORMAT binary) into a table with a vector
-- column: COPY hands the field's bytes, and exactly those, to
-- knn_vector_recv with the column's typmod. Both COPYs are server-side, so
-- the test needs a superuser (pg_regress's user); the file is
-- vector_fuzz.copy in the data directory (the one place the server can
-- always write), overwritten for each input and left there at the end. A
-- BEFORE INSERT trigger on the target tables records what was received and
-- drops the row, so the tables stay empty.
--

\i sql/fuzz_helpers.psql

SELECT setseed(0.42);
SET extra_float_digits = 1;
CREATE SCHEMA vector_fuzz;
CREATE TABLE vector_fuzz.start AS
	SELECT pg_postmaster_start_time() AS started, pg_backend_pid() AS pid;
-- failures(kind, input, typmod, expected, actual): the first 20 of each kind
CREATE TABLE vector_fuzz.failures (kind text, input text, typmod int, expected text, actual text);
CREATE TABLE vector_fuzz.summary (kind text, inputs int, outcomes text[], mismatches int,
	wrong_sqlstate int, unexpected_sqlstate int, wrong_value int);

-- ---------------------------------------------------------------- text --

-- Whether a number that float4in finds out of range is small (underflow,
-- read as zero) rather than large: the sign of its order of magnitude. NULL
-- when t is not all one number: float4in reports a range error for a number
-- at its start before looking at what follows ('1e39x').
CREATE FUNCTION vector_fuzz.underflows(t text) RETURNS bool
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
	m text[];
	scale int := 4;				-- bits per hex digit
	int_part text;
	frac_part text;
	ord numeric;
BEGIN
	m := regexp_match(t, '^[+-]?0[xX]([0-9a-fA-F]*)(\.[0-9a-fA-F]*)?([pP][+-]?[0-9]+)?$');
	IF m IS NULL THEN
		scale := 1;
		m := regexp_match(t, '^[+-]?([0-9]*)(\.[0-9]*)?([eE][+-]?[0-9]+)?$');
	END IF;
	IF m IS NULL THEN
		RETURN NULL;
	END IF;
	int_part := ltrim(m[1], '0');
	frac_part := substr(coalesce(m[2], '.'), 2);
	IF int_part <> '' THEN
		ord := length(int_part);
	ELSE
		ord := -(length(frac_part) - length(ltrim(frac_part, '0')));
	END IF;
	RETURN ord * scale + coalesce(substr(m[3], 2)::numeric, 0) < 0;
END $$;

-- The reference: state 'ok' (vals = the elements) or the expected SQLSTATE;
-- alt = other SQLSTATEs also right for this input (see the header).
CREATE FUNCTION vector_fuzz.ref_text(s text, tm int, OUT state text, OUT alt text[], OUT vals real[])
LANGUAGE plpgsql AS $$
DECLARE
	blanks constant text := E' \t\n\r\f\x0B';
	rest text;
	body text;
	tail text;
	closing int;
	toks text[];
	t text;
	v real;
	n int;
	invalid bool;
BEGIN
	alt := '{}';
	rest := substring(s from '^[ \t\n\r\v\f]*\[(.*)$');
	IF rest IS NULL THEN
		state := '22P02';
		RETURN;
	END IF;
	IF rest ~ '^[ \t\n\r\v\f]*\]' THEN
		state := '22000';
		RETURN;
	END IF;
	closing := strpos(rest, ']');
	IF closing = 0 THEN
		body := rest;
	ELSE
		body := left(rest, closing - 1);
		tail := substr(rest, closing + 1);
	END IF;
	toks := CASE WHEN body = '' THEN ARRAY[''] ELSE string_to_array(body, ',') END;
	n := cardinality(toks);
	vals := '{}';
	FOR i IN 1 .. n LOOP
		IF i > 16000 THEN
			state := '54000';
			vals := NULL;
			RETURN;
		END IF;
		t := btrim(toks[i], blanks);
		invalid := false;
		IF t ~ '^[+-]?[0-9]{1,7}(\.[0-9]{0,7})?$' THEN
			v := t::real;		-- plainly a number in range: no subtransaction
		ELSIF t !~ '^[0-9A-Za-z.+_()-]+$' THEN
			invalid := true;	-- no number has other characters
		ELSE
			BEGIN
				v := t::real;
			EXCEPTION
				WHEN invalid_text_representation THEN
					invalid := true;
				WHEN numeric_value_out_of_range THEN
					CASE vector_fuzz.underflows(t)
						WHEN true THEN
							v := CASE WHEN t LIKE '-%' THEN '-0'::real ELSE '0'::real END;
						WHEN false THEN
							state := '22003';
							vals := NULL;
							RETURN;
						ELSE
							invalid := true;
					END CASE;
			END;
		END IF;
		IF invalid THEN
			state := '22P02';
			-- strtof may read a NaN, an infinity or an out-of-range number
			-- at its start
			IF t ~* '^[+-]?(nan|inf)' THEN
				alt := alt || '22000'::text;
			END IF;
			IF t ~ '^[+-]?\.?[0-9]' THEN
				alt := alt || '22003'::text;
			END IF;
			vals := NULL;
			RETURN;
		END IF;
		IF v = 'NaN'::real OR v = 'Infinity'::real OR v = '-Infinity'::real THEN
			state := '22000';
			vals := NULL;
			RETURN;
		END IF;
		vals := vals || v;
		IF i = n AND closing = 0 THEN
			state := '22P02';	-- the text ends without ']'
			vals := NULL;
			RETURN;
		END IF;
	END LOOP;
	IF tail !~ '^[ \t\n\r\v\f]*$' THEN
		state := '22P02';
		vals := NULL;
		RETURN;
	END IF;
	IF tm <> -1 AND tm <> n THEN
		state := '22000';
		vals := NULL;
		RETURN;
	END IF;
	state := 'ok';
END $$;

-- The input function itself: the cast text -> vector, or with a typmod
-- knn_vector_in(cstring, oid, typmod) as a literal 'x'::vector(n) calls it.
CREATE FUNCTION vector_fuzz.try_text(s text, tm int, OUT state text, OUT v vector)
LANGUAGE plpgsql AS $$
BEGIN
	IF tm = -1 THEN
		v := s::vector;
	ELSE
		v := knn_vector_in(s::cstring, 'vector'::regtype, tm);
	END IF;
	state := 'ok';
EXCEPTION WHEN OTHERS THEN
	state := SQLSTATE;
	v := NULL;
END $$;

-- mutations: pg_temp.fuzz_mutate_text (sql/fuzz_helpers.psql)

CREATE FUNCTION vector_fuzz.run_text(min_inputs int, max_inputs int, max_seconds float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	-- tried first as they are: every outcome appears among them
	corpus text[] := ARRAY['[]', '[ ]', '', '   ', '1,2', '[1,2', '[1,2]x', '[1,,2]', '[a]',
		'[1,NaN]', '[inf]', '[-Infinity]', '[1e39]', '[-0x1p200]', '[nan x]', '[1e39x]'];
	-- valid texts, the material of the mutations (tried as they are, too)
	seeds text[] := ARRAY['[1,2,3]', ' [ 1 , 2.5 ,-3e2 ] ', E'\t[\n1\r,\f2\x0B]\n',
		'[0.1,+1.5,-0,100000000,1.0000001,16777217]',
		-- just above the midpoint of 1 and the next float: read through a
		-- double first it would become 1 (double rounding)
		'[1.0000000596046448,-1.0000000596046448]',
		'[3.4028235e38,-3.4028235e38,1.17549435e-38,1e-45]',
		'[1E+3,2e-3,.5,5.,-.25,+0.0,00012]', '[0x1p-3,0X1.8P+1,-0x.8p1,0xff]',
		'[1e-50,-1e-46,7e-46]', '[7]', '[-0]',
		'[123456789012345678901234567890,0.000000000000000000000000000000000000000000001]'];
	pieces text[] := ARRAY['0', '1', '2', '3', '5', '7', '9', '00', '.', '..', 'e', 'E', 'e+', 'e-',
		'+', '-', '--', '[', ']', '[[', ']]', ',', ',,', ' ', '  ', E'\t', E'\n', E'\r', E'\f', E'\x0B',
		'nan', 'NaN', '-nan', 'nan(1)', 'inf', '-inf', 'Infinity', '-Infinity', 'infinity', 'INF',
		'0x', '0x1p', 'p', 'P', 'x', 'X', 'a', 'f', 'z', '_', '(', ')', '{', '}', '"', '''', '\',
		';', ':', '*', 'null', 'NULL', 'e38', 'e39', 'e-38', 'e-45', 'e-46', 'e-50', 'e99', 'e-99',
		'e999999999999', '3.4028235e38', '3.4028236e38', '1.17549435e-38', '1e-45', '7e-46',
		'16777217', '0.1', '123456789012345678901234567890', '', '', '', ''];
	started timestamptz := clock_timestamp();
	ncorpus int;
	i int := 0;
	s text;
	tm int;
	r float8;
	ref record;
	got record;
	expected_bytes bytea;
	failure text;
	expected text;
	outcomes text[] := '{}';
	nfail int[] := '{0,0,0,0}';	-- mismatches, wrong_sqlstate, unexpected_sqlstate, wrong_value
BEGIN
	-- long valid texts: 100 random numbers; 15999, 16000 and 16001 elements
	seeds := seeds || (SELECT '[' || string_agg(((random() - 0.5) * 10 ^ (random() * 20 - 10))::real::text, ',') || ']'
					   FROM generate_series(1, 100));
	seeds := seeds || ('[' || repeat('1.5,', 15998) || '-2]') || ('[' || repeat('1,', 15999) || '0]');
	corpus := corpus || ('[' || repeat('0, ', 16000) || '0]');
	-- non-ASCII pieces, where the database encoding has them
	FOR k IN 1 .. 13 LOOP
		BEGIN
			pieces := pieces || convert_from(decode((ARRAY['c3a9', 'e282ac', 'c2a0', 'f09f9880', 'efbc91',
				'd9a3', 'e28892', 'e38080', 'e280a8', 'cc81', 'efbbbf', 'efbc8c', 'efbcbb'])[k], 'hex'), 'UTF8');
		EXCEPTION WHEN OTHERS THEN
			NULL;
		END;
	END LOOP;
	corpus := corpus || seeds;
	ncorpus := cardinality(corpus);

	LOOP
		EXIT WHEN i >= max_inputs
			OR (i >= min_inputs AND clock_timestamp() - started > make_interval(secs => max_seconds));
		i := i + 1;
		IF i <= ncorpus THEN
			s := corpus[i];
			tm := -1;
		ELSE
			s := pg_temp.fuzz_mutate_text(seeds[1 + floor(random() * cardinality(seeds))::int], pieces);
			r := random();
			tm := CASE WHEN r < 0.6 THEN -1
					   -- the dimension the text seems to have
					   WHEN r < 0.8 THEN length(s) - length(replace(s, ',', '')) + 1
					   ELSE (ARRAY[1, 2, 3, 16000])[1 + floor(random() * 4)::int] END;
		END IF;

		ref := vector_fuzz.ref_text(s, tm);
		got := vector_fuzz.try_text(s, tm);
		IF NOT got.state = ANY (outcomes) THEN
			outcomes := outcomes || got.state;
		END IF;

		failure := NULL;
		expected := ref.state;
		IF got.state = 'ok' AND ref.state = 'ok' THEN
			expected_bytes := int2send(cardinality(ref.vals)::int2) || '\x0000'::bytea ||
				(SELECT string_agg(float4send(x), ''::bytea ORDER BY o) FROM unnest(ref.vals) WITH ORDINALITY AS u(x, o));
			IF knn_vector_send(got.v) <> expected_bytes THEN
				failure := 'wrong_value';
				expected := encode(expected_bytes, 'hex');
			ELSIF vector_dims(got.v) <> cardinality(ref.vals) THEN
				failure := 'wrong_value';
				expected := 'dims ' || cardinality(ref.vals);
			ELSIF got.v::text <> '[' || array_to_string(ref.vals, ',') || ']' THEN
				failure := 'wrong_value';
				expected := 'text [' || array_to_string(ref.vals, ',') || ']';
			ELSIF knn_vector_send(got.v::text::vector) <> expected_bytes THEN
				failure := 'wrong_value';
				expected := 'round trip ' || encode(expected_bytes, 'hex');
			END IF;
		ELSIF got.state NOT IN ('ok', '22P02', '22000', '22003', '54000') THEN
			failure := 'unexpected_sqlstate';
		ELSIF (got.state = 'ok') <> (ref.state = 'ok') THEN
			failure := 'mismatch';
		ELSIF got.state <> ref.state AND NOT got.state = ANY (ref.alt) THEN
			failure := 'wrong_sqlstate';
		END IF;

		IF failure IS NOT NULL THEN
			nfail[array_position(ARRAY['mismatch', 'wrong_sqlstate', 'unexpected_sqlstate', 'wrong_value'], failure)] :=
				nfail[array_position(ARRAY['mismatch', 'wrong_sqlstate', 'unexpected_sqlstate', 'wrong_value'], failure)] + 1;
			IF (SELECT count(*) FROM vector_fuzz.failures WHERE kind = 'text') < 20 THEN
				INSERT INTO vector_fuzz.failures VALUES ('text', left(s, 300), tm, left(expected, 300),
					left(CASE WHEN got.state = 'ok' THEN got.state || ' ' || encode(knn_vector_send(got.v), 'hex')
							  ELSE got.state END, 300) || ' (' || failure || ')');
			END IF;
		END IF;
	END LOOP;

	INSERT INTO vector_fuzz.summary VALUES ('text', i, outcomes, nfail[1], nfail[2], nfail[3], nfail[4]);
	RAISE LOG 'vector_fuzz: % text inputs in % s', i,
		round(extract(epoch FROM clock_timestamp() - started)::numeric, 1);
END $$;

-- 300 inputs at least, 20000 at most, about 9 seconds
SELECT vector_fuzz.run_text(300, 20000, 9);

-- no disagreement with the reference; every error an expected SQLSTATE;
-- acceptance and each kind of error were seen
SELECT mismatches, wrong_sqlstate, unexpected_sqlstate, wrong_value,
	outcomes @> '{ok,22P02,22000,22003,54000}' AS all_outcomes_seen
FROM vector_fuzz.summary WHERE kind = 'text';
SELECT input, typmod, expected, actual FROM vector_fuzz.failures WHERE kind = 'text';

-- -------------------------------------------------------------- binary --

-- The reference: 'ok' or the expected SQLSTATE for payload p under typmod tm.
CREATE FUNCTION vector_fuzz.ref_bin(p bytea, tm int) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
	len int := length(p);
	dim int;
	unused int;
	complete int;
BEGIN
	IF len < 4 THEN
		RETURN '08P01';			-- dim and unused are both read first
	END IF;
	dim := get_byte(p, 0) * 256 + get_byte(p, 1);
	unused := get_byte(p, 2) * 256 + get_byte(p, 3);
	IF dim < 1 THEN
		RETURN '22000';
	ELSIF dim > 16000 THEN
		RETURN '54000';
	ELSIF tm <> -1 AND tm <> dim THEN
		RETURN '22000';
	ELSIF unused <> 0 THEN
		RETURN '22000';
	END IF;
	complete := least(dim, (len - 4) / 4);
	-- a NaN or an infinity (exponent bits all ones) before the data ends
	IF EXISTS (SELECT FROM generate_series(0, complete - 1) AS i
			   WHERE get_byte(p, 4 + 4 * i) & 127 = 127 AND get_byte(p, 5 + 4 * i) & 128 = 128) THEN
		RETURN '22000';
	ELSIF complete < dim THEN
		RETURN '08P01';
	ELSIF len > 4 + 4 * dim THEN
		RETURN '22P03';
	END IF;
	RETURN 'ok';
END $$;

-- Records what the receive function made of the row being loaded, and keeps
-- nothing: its binary form, its dimension, and its binary form after a trip
-- through the text form.
CREATE FUNCTION vector_fuzz.capture() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM set_config('vector_fuzz.received',
		encode(knn_vector_send(NEW.v), 'hex') || ' ' || vector_dims(NEW.v) || ' ' ||
		encode(knn_vector_send(NEW.v::text::vector), 'hex'), true);
	RETURN NULL;
END $$;
CREATE TABLE vector_fuzz.bin_any (v vector);
CREATE TABLE vector_fuzz.bin_1 (v vector(1));
CREATE TABLE vector_fuzz.bin_3 (v vector(3));
CREATE TABLE vector_fuzz.bin_16000 (v vector(16000));
CREATE TRIGGER capture BEFORE INSERT ON vector_fuzz.bin_any FOR EACH ROW EXECUTE FUNCTION vector_fuzz.capture();
CREATE TRIGGER capture BEFORE INSERT ON vector_fuzz.bin_1 FOR EACH ROW EXECUTE FUNCTION vector_fuzz.capture();
CREATE TRIGGER capture BEFORE INSERT ON vector_fuzz.bin_3 FOR EACH ROW EXECUTE FUNCTION vector_fuzz.capture();
CREATE TRIGGER capture BEFORE INSERT ON vector_fuzz.bin_16000 FOR EACH ROW EXECUTE FUNCTION vector_fuzz.capture();

-- A valid payload of dim elements: random numbers of all magnitudes, or
-- (a quarter of the time) random 32-bit patterns, among which are NaNs,
-- infinities and subnormals.
CREATE FUNCTION vector_fuzz.make_bin(dim int) RETURNS bytea
LANGUAGE plpgsql AS $$
BEGIN
	IF random() < 0.75 THEN
		RETURN int2send(dim::int2) || '\x0000'::bytea ||
			(SELECT string_agg(float4send(((random() - 0.5) * 10 ^ (random() * 40 - 20))::real), ''::bytea)
			 FROM generate_series(1, dim));
	END IF;
	RETURN int2send(dim::int2) || '\x0000'::bytea ||
		(SELECT string_agg(int4send((floor(random() * 4294967296) - 2147483648)::int), ''::bytea)
		 FROM generate_series(1, dim));
END $$;

-- The two bytes of an unsigned 16-bit number, big-endian.
CREATE FUNCTION vector_fuzz.u16(v int) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT decode(lpad(to_hex(v), 4, '0'), 'hex') $$;

-- 0..3 random edits: truncate; append 1..8 random bytes; set a random byte;
-- overwrite dim (0, 1, dim +- 1, 3, 16000, 16001, 32767, 32768 (negative as
-- an int16), 65535, random); overwrite unused; overwrite an element with a
-- special bit pattern (NaNs, infinities, subnormal, -0, extremes); insert or
-- delete 1..3 bytes somewhere (misaligning the rest).
CREATE FUNCTION vector_fuzz.mutate_bin(p bytea, dim int) RETURNS bytea
LANGUAGE plpgsql AS $$
DECLARE
	len int;
	pos int;
	k int;
BEGIN
	FOR j IN 1 .. floor(random() * 4)::int LOOP
		len := length(p);
		pos := floor(random() * (len + 1))::int;
		k := 1 + floor(random() * 3)::int;
		CASE floor(random() * 7)::int
			WHEN 0 THEN
				p := pg_temp.fuzz_edit_bytes(p, 'truncate', pos, k);
			WHEN 1 THEN
				p := pg_temp.fuzz_edit_bytes(p, 'append', pos, k);
			WHEN 2 THEN
				p := pg_temp.fuzz_edit_bytes(p, 'set', pos, k);
			WHEN 3 THEN
				IF len >= 2 THEN
					p := overlay(p PLACING vector_fuzz.u16((ARRAY[0, 1, dim - 1, dim + 1, 3, 16000, 16001,
						32767, 32768, 65535, floor(random() * 65536)::int])[1 + floor(random() * 11)::int]) FROM 1 FOR 2);
				END IF;
			WHEN 4 THEN
				IF len >= 4 THEN
					p := overlay(p PLACING vector_fuzz.u16((ARRAY[1, 255, 256, 32768, 65535,
						floor(random() * 65536)::int])[1 + floor(random() * 6)::int]) FROM 3 FOR 2);
				END IF;
			WHEN 5 THEN
				IF len >= 8 THEN
					p := overlay(p PLACING decode((ARRAY['7fc00000', 'ffc00000', '7f800001', '7fffffff',
						'7f800000', 'ff800000', '00000001', '80000001', '80000000', '7f7fffff', 'ff7fffff',
						'00800000'])[1 + floor(random() * 12)::int], 'hex')
						FROM 5 + 4 * floor(random() * ((len - 4) / 4))::int FOR 4);
				END IF;
			ELSE
				p := pg_temp.fuzz_edit_bytes(p, 'shift', pos, k);
		END CASE;
	END LOOP;
	RETURN p;
END $$;

CREATE FUNCTION vector_fuzz.run_bin(min_inputs int, max_inputs int, max_seconds float8) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
	-- tried first as they are (typmod in corpus_tm): every outcome appears
	corpus bytea[] := ARRAY['\x000200003f800000c0000000', '\x', '\x00', '\x0001', '\x000100',
		'\x00000000', '\x3e8100003f800000', '\xffff00003f800000', '\x800000003f800000',
		'\x000100013f800000', '\x000200003f8000007fc00000', '\x00010000ff800000',
		'\x000200003f800000', '\x000100003f8000003f800000', '\x000200003f800000c0000000',
		'\x000100000000000180000000']::bytea[];
	corpus_tm int[] := ARRAY[-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 3, 1];
	path text := current_setting('data_directory') || '/vector_fuzz.copy';
	started timestamptz := clock_timestamp();
	i int := 0;
	p bytea;
	dim int;
	tm int;
	ref text;
	got record;
	failure text;
	outcomes text[] := '{}';
	nfail int[] := '{0,0,0,0}';	-- mismatches, wrong_sqlstate, unexpected_sqlstate, wrong_value
BEGIN
	LOOP
		EXIT WHEN i >= max_inputs
			OR (i >= min_inputs AND clock_timestamp() - started > make_interval(secs => max_seconds));
		i := i + 1;
		IF i <= cardinality(corpus) THEN
			p := corpus[i];
			tm := corpus_tm[i];
		ELSE
			dim := CASE WHEN random() < 0.03 THEN 16000
						ELSE (ARRAY[1, 1, 2, 3, 3, 3, 4, 5, 8, 16, 31, 100, 1000])[1 + floor(random() * 13)::int] END;
			p := vector_fuzz.mutate_bin(vector_fuzz.make_bin(dim), dim);
			tm := CASE WHEN random() < 0.7 THEN -1 ELSE (ARRAY[1, 3, 16000])[1 + floor(random() * 3)::int] END;
		END IF;

		ref := vector_fuzz.ref_bin(p, tm);
		got := pg_temp.fuzz_copy_in(p, 'vector_fuzz.' || CASE WHEN tm = -1 THEN 'bin_any' ELSE 'bin_' || tm END, path,
			'vector_fuzz.received');
		IF NOT got.state = ANY (outcomes) THEN
			outcomes := outcomes || got.state;
		END IF;

		failure := NULL;
		IF got.state = 'ok' AND ref = 'ok' THEN
			IF got.received <> encode(p, 'hex') || ' ' || (get_byte(p, 0) * 256 + get_byte(p, 1)) || ' ' || encode(p, 'hex') THEN
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
			nfail[array_position(ARRAY['mismatch', 'wrong_sqlstate', 'unexpected_sqlstate', 'wrong_value'], failure)] :=
				nfail[array_position(ARRAY['mismatch', 'wrong_sqlstate', 'unexpected_sqlstate', 'wrong_value'], failure)] + 1;
			IF (SELECT count(*) FROM vector_fuzz.failures WHERE kind = 'binary') < 20 THEN
				INSERT INTO vector_fuzz.failures VALUES ('binary', left(encode(p, 'hex'), 300), tm, ref,
					left(got.state || ' ' || coalesce(got.received, ''), 300) || ' (' || failure || ')');
			END IF;
		END IF;
	END LOOP;

	INSERT INTO vector_fuzz.summary VALUES ('binary', i, outcomes, nfail[1], nfail[2], nfail[3], nfail[4]);
	RAISE LOG 'vector_fuzz: % binary inputs in % s', i,
		round(extract(epoch FROM clock_timestamp() - started)::numeric, 1);
END $$;

-- 200 inputs at least, 20000 at most, about 6 seconds
SELECT vector_fuzz.run_bin(200, 20000, 6);

SELECT mismatches, wrong_sqlstate, unexpected_sqlstate, wrong_value,
	outcomes @> '{ok,08P01,22000,22P03,54000}' AS all_outcomes_seen
FROM vector_fuzz.summary WHERE kind = 'binary';
SELECT input, typmod, expected, actual FROM vector_fuzz.failures WHERE kind = 'binary';

-- ------------------------------------------------------------- after --

-- the server did not restart and this backend is the one that began
SELECT pg_postmaster_start_time() = started AS server_alive, pg_backend_pid() = pid AS same_backend
FROM vector_fuzz.start;
SELECT '[1,2,3]'::vector <-> '[1,2,5]'::vector AS distance, vector_dims('[1,2,3]'::vector) AS dims;

RESET extra_float_digits;
SET client_min_messages = warning;
DROP SCHEMA vector_fuzz CASCADE;
