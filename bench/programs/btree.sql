-- bench/programs/btree.sql: SQLite in memory for the programs set of
-- bench/run: 300k rows with a text index (its page cache mallocs ~4 KiB
-- pages), a range count and a grouping.
CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);
CREATE INDEX tb ON t(b);
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 300000)
INSERT INTO t SELECT x, hex(randomblob(16)), x * 1.5 FROM n;
SELECT count(*), sum(length(b)) FROM t WHERE b > '8';
SELECT substr(b, 1, 3), count(*) FROM t GROUP BY 1 ORDER BY 2 DESC LIMIT 3;
