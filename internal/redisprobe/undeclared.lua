--!df flags=allow-undeclared-keys
-- Probes, for the scripts of global limits (internal/regions), that the
-- server lets a script touch a key it did not declare, in the hash slot of
-- one it did (package redisprobe). KEYS[1]: a key of sluice's that holds
-- nothing; the key read holds nothing either.
return #redis.call('HGETALL', KEYS[1] .. ':undeclared')
