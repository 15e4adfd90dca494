package redisstore

// RefundsPerCall is refundsPerCall, for the tests of RefundBatch's calls.
const RefundsPerCall = refundsPerCall
