-- Files are kept per owner: the tenant whose turn wrote them ('' without tenants). The same
-- bytes written by two tenants are two files, each with its own retention, and one tenant's
-- write never extends another's. Their URLs are signed (src/files.rs), never the bare hash.
ALTER TABLE files ADD COLUMN owner text NOT NULL DEFAULT '';
ALTER TABLE files DROP CONSTRAINT files_pkey;
ALTER TABLE files ADD PRIMARY KEY (owner, sha256);
