-- Replies per backend instance (docs/client-protocol.md): the instance whose queue receives the
-- replies of a turn's current round trip, from the `reply_to` of the submission that started it.
-- NULL: the session's own reply queue, as before.
ALTER TABLE turns ADD COLUMN reply_to text;
