/**
 * The result protocol: where chained forwards end. The last stage of a chain sends the
 * output to the job's owner as a tensor frame whose requestId is the owner's `replyTo`;
 * a stage that fails sends {id, type: 'error', error, message} instead.
 */
export const RESULT_PROTOCOL = '/tensorlink/result/1.0.0';

/** Result streams one peer may hold open to a user: one per worker that ends a chain. */
export const MAX_RESULT_STREAMS = 64;
