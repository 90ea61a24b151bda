-- The session model of Session Architecture §2.3: a display name (from the first instruction,
-- renamable with `aptix session rename`) and when the session expires (the assemble retention
-- after its last turn, extended by each new one).
ALTER TABLE sessions ADD COLUMN name text;
ALTER TABLE sessions ADD COLUMN expires_at timestamptz;
