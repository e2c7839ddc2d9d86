"""Dynamic batching: pure merge/split of numpy batches and the asyncio stage that forms them."""
