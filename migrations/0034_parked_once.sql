-- A reply is parked once per queue: a delivery handled again (its outputs published again after a
-- failure, or the message redelivered) parked another copy of each reply its client's queue
-- refused, and the copies filled the queue's 1,000 waiting replies. Copies parked before this
-- are dropped (the oldest stays: it was parked first, so it is offered in its place).
DELETE FROM undelivered a USING undelivered b
WHERE a.queue = b.queue AND a.message ->> 'message_id' = b.message ->> 'message_id'
  AND a.id > b.id;
CREATE UNIQUE INDEX undelivered_once ON undelivered (queue, (message ->> 'message_id'));
