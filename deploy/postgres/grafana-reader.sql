-- Run once by the postgres image at first start: a read-only role for Grafana's cost
-- panels, granted SELECT on every table the gateway's migrations create later.
CREATE ROLE grafana LOGIN PASSWORD 'grafana';
GRANT CONNECT ON DATABASE gateway TO grafana;
GRANT USAGE ON SCHEMA public TO grafana;
ALTER DEFAULT PRIVILEGES FOR ROLE gateway IN SCHEMA public GRANT SELECT ON TABLES TO grafana;
